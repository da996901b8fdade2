//! `sockets`: a sink that tries the network without `wasi:http` — a TCP
//! connection to config `addr` and a UDP datagram to it (`wasi:sockets`,
//! through Rust's `std::net`) — and rejects each event with what happened,
//! or answers delivered if a socket ever worked.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use std::cell::RefCell;

use bindings::{Event, Outcome};

thread_local! {
    static ADDR: RefCell<String> = const { RefCell::new(String::new()) };
}

struct Sockets;

fn attempt(addr: &str) -> Result<(), String> {
    let tcp = std::net::TcpStream::connect(addr).map(|_| ());
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(b"x", addr).map(|_| ()));
    match (tcp, udp) {
        (Err(t), Err(u)) => Err(format!("tcp: {t}; udp: {u}")),
        (Ok(()), _) => Ok(()),
        (_, Ok(())) => Ok(()),
    }
}

impl bindings::Guest for Sockets {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        let addr = config
            .into_iter()
            .find(|(k, _)| k == "addr")
            .map(|(_, v)| v)
            .ok_or("config key `addr` is required")?;
        ADDR.with(|a| *a.borrow_mut() = addr);
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let addr = ADDR.with(|a| a.borrow().clone());
        batch
            .iter()
            .map(|_| match attempt(&addr) {
                Ok(()) => Outcome::Delivered,
                Err(e) => Outcome::Reject(e),
            })
            .collect()
    }
}

bindings::export!(Sockets with_types_in bindings);
