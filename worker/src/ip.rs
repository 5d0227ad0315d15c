//! This node's IP address, for the per-process logs (CONTRACT.md §7).

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::OnceLock;

/// The address this host's outbound traffic leaves from: the local side of a UDP socket
/// connected to a public address (connecting sends nothing), else loopback. Asked once.
pub fn node_ip() -> IpAddr {
    static IP: OnceLock<IpAddr> = OnceLock::new();
    *IP.get_or_init(|| outbound_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

fn outbound_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}
