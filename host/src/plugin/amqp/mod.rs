//! AMQP publishing for plugins: the host side of `outboxd:sink/amqp`, in
//! two rooms: a plugin's grant and the checks of each message
//! ([`access`]), and sending with confirms ([`publish`]), over the broker
//! connections and their backoff of [`crate::broker`] (shared with the
//! `amqp` source).
//!
//! Owns: one connection per broker URL ([`AmqpPool`], owned by the
//! [`Runtime`](super::Runtime) and shared by every plugin that names the
//! same URL), a few idle channels per connection in publisher-confirm mode,
//! the check of each message against the manifest's exchange patterns
//! ([`AmqpAccess`]), and `publish-batch`: send every message of a call on
//! one channel, then await all their confirms together (one confirm costs
//! the broker an fsync: about 540 messages/s one at a time against about
//! 9,500/s with 100 in flight, docs/measurements.md). When the broker goes away the
//! connection is dropped and opened again on demand, no sooner than an
//! exponential backoff allows, so a dead broker costs a batch one fast
//! `unavailable`, not a connect timeout each.
//!
//! Must never: touch a broker for a message whose exchange the manifest does
//! not grant; answer `ok` for a message without a positive confirm (anything
//! in flight when a connection or channel drops, or still unconfirmed at the
//! batch deadline, is an error); log or return a broker URL with its
//! password ([`crate::redact::redact_url`]).

mod access;
mod publish;

pub use crate::broker::{check_url, same_broker, AmqpPool, BrokerStatus};
pub use access::{AmqpAccess, MAX_MESSAGES_PER_CALL};
