//! The wire by hand, over plain sockets: frames, and a worker's side of the handshake, for
//! tests that play a peer the library would never be.

use std::io::{Read, Write};
use std::net::TcpStream;

use hmac::{KeyInit, Mac};
use malleable::cluster::{frame, handshake};

/// Sends one length-prefixed frame.
pub fn send_frame(s: &mut TcpStream, body: &[u8]) {
    try_send_frame(s, body).unwrap();
}

/// Sends one length-prefixed frame, or says why the socket refused it.
pub fn try_send_frame(s: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    s.write_all(&(body.len() as u32).to_be_bytes())?;
    s.write_all(body)
}

/// Reads one length-prefixed frame, or `None` if the other side closed the connection.
pub fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// `body` after the magic and `version`: the first frame of a handshake.
pub fn versioned<T: serde::Serialize>(version: u32, body: &T) -> Vec<u8> {
    let mut f = frame::MAGIC.to_vec();
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&frame::encode(body));
    f
}

/// A worker's hello for the job `walk` in version 1, one thread, nonce `[7; 32]`.
pub fn hello_frame(version: u32) -> Vec<u8> {
    hello_frame_for(version, "walk")
}

/// A worker's hello for the job `job` in version 1, one thread, nonce `[7; 32]`.
pub fn hello_frame_for(version: u32, job: &str) -> Vec<u8> {
    versioned(
        version,
        &handshake::Hello {
            jobs: vec![handshake::JobType {
                name: job.into(),
                version: 1,
                layout: None,
            }],
            threads: 1,
            node: "raw".into(),
            nonce: [7; 32],
        },
    )
}

/// `HMAC-SHA256(token, label ‖ a ‖ b)`, the proofs of the handshake.
pub fn mac(token: &str, label: &[u8], a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(token.as_bytes()).unwrap();
    mac.update(label);
    mac.update(a);
    mac.update(b);
    mac.finalize().into_bytes().into()
}

/// A connection that completed the handshake with `token` as a worker of the job `walk`
/// (version 1, one thread), by hand: the worker's proof is `HMAC-SHA256(token, "malleable
/// worker v1" ‖ nc ‖ nw)`.
pub fn authenticated(addr: &str, token: &str) -> TcpStream {
    authenticated_as(addr, token, "walk")
}

/// As [`authenticated`], as a worker of the job `job` (version 1, one thread).
pub fn authenticated_as(addr: &str, token: &str, job: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    send_frame(&mut s, &hello_frame_for(frame::PROTOCOL_VERSION, job));
    let challenge = read_frame(&mut s).expect("a challenge");
    let handshake::Reply::Challenge { nonce: nc, .. } =
        handshake::decode_reply("coordinator", &challenge).unwrap()
    else {
        panic!("not a challenge");
    };
    let proof = mac(token, b"malleable worker v1", &nc, &[7; 32]);
    send_frame(&mut s, &frame::encode(&handshake::ProofMsg { proof }));
    let welcome = read_frame(&mut s).expect("a welcome");
    assert!(
        matches!(
            handshake::decode_welcome("coordinator", &welcome).unwrap(),
            handshake::Reply::Welcome { version: 1, .. }
        ),
        "not welcomed"
    );
    s
}
