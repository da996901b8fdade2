//! Host bindings for the `outboxd:sink` world, generated once from `wit/`.
//! The rest of the host uses these types through this module only.

// Generated from the WIT, whose own comments document each item there.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "sink",
    // Publishing waits on the broker's confirms, a batch of HTTP requests
    // on their answers, and a long HMAC gives the worker back between
    // slices: async host functions.
    imports: {
        "outboxd:sink/amqp.publish-batch": async,
        "outboxd:sink/http-batch.send-batch": async,
        "outboxd:sink/http-batch.wait": async,
        "outboxd:sink/hmac.sha256": async,
    },
    exports: { default: async },
});

pub use self::outboxd::sink::amqp::{Message as AmqpMessage, PublishError};
pub use self::outboxd::sink::http_batch::{
    Request as HttpBatchRequest, RequestError as HttpRequestError, Response as HttpBatchResponse,
};
pub use self::outboxd::sink::log::Level;
pub use self::outboxd::sink::types::RetryInfo;
