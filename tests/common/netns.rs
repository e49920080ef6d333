//! Network namespaces for tests of worker processes on hosts apart: each namespace is a
//! host with one veth link to this (the root) namespace, where the coordinator listens. The
//! root namespace does not forward between links (`net.ipv4.ip_forward` is left as it is,
//! and the test checks it is off), so two namespaces reach the coordinator but not each
//! other: a network partition between hosts, as on a cluster whose nodes lost their links
//! to each other but not to the head node.
//!
//! Needs root and `ip` (iproute2; installed with apt-get if missing, as `.ci/run` does).
//! Namespaces and links are removed when the [`Hosts`] is dropped.

use std::process::Command;

/// Runs `ip` with `args`; panics with its output if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs iproute2 if `ip` is missing.
fn ensure_ip() {
    if Command::new("ip").arg("-V").output().is_ok() {
        return;
    }
    let ok = Command::new("sh")
        .args([
            "-c",
            "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "`ip` is missing and iproute2 did not install");
}

/// Namespaces, each a host with an address that reaches the root namespace's.
pub struct Hosts {
    names: Vec<String>,
    links: Vec<String>,
    /// The network of the first host.
    first: usize,
}

impl Hosts {
    /// `n` namespaces named from `tag` (short: interface names have at most 15 bytes).
    /// Host `i` has address `10.217.{i + 1}.2`, and reaches the root namespace at
    /// `10.217.{i + 1}.1` ([`Hosts::gateway`]).
    pub fn new(tag: &str, n: usize) -> Hosts {
        Hosts::numbered(tag, n, 1)
    }

    /// As [`Hosts::new`], host `i` on network `10.217.{first + i}.0/24`: tests that run at
    /// the same time take networks apart.
    pub fn numbered(tag: &str, n: usize, first: usize) -> Hosts {
        ensure_ip();
        let forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
        assert_eq!(
            forward.trim(),
            "0",
            "the root namespace forwards between links: hosts would reach each other"
        );
        let mut hosts = Hosts {
            names: Vec::new(),
            links: Vec::new(),
            first,
        };
        for i in 0..n {
            let ns = format!("{tag}{i}");
            let (outside, inside) = (format!("{tag}{i}o"), format!("{tag}{i}i"));
            // Leftovers of a run that was killed.
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            let _ = Command::new("ip").args(["link", "del", &outside]).output();
            ip(&["netns", "add", &ns]);
            hosts.names.push(ns.clone());
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ]);
            hosts.links.push(outside.clone());
            ip(&["link", "set", &inside, "netns", &ns]);
            let net = first + i;
            ip(&[
                "addr",
                "add",
                &format!("10.217.{net}.1/24"),
                "dev",
                &outside,
            ]);
            ip(&["link", "set", &outside, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.217.{net}.2/24"),
                "dev",
                &inside,
            ]);
            ip(&["-n", &ns, "link", "set", &inside, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                "default",
                "via",
                &format!("10.217.{net}.1"),
            ]);
        }
        hosts
    }

    /// The namespace of host `i`, for `ip netns exec`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The root namespace's address on host `i`'s link: where it reaches the coordinator.
    pub fn gateway(&self, i: usize) -> String {
        format!("10.217.{}.1", self.first + i)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }
}
