//! Fault injection for the tools, from the environment: a seeded share of the datagrams a UDP
//! link sends or receives is dropped ([`DropHook`]), so that a test harness (the guest matrix's
//! lossy cells) runs an unmodified tool over a lossy link. The socket link itself never reads
//! the environment; the tools read it here and pass the hook in [`OpenOptions::drop`]
//! (`crate::open`).
//!
//! * `ROCE_LINK_DROP_PPM`: datagrams dropped per million, 0 ..= 1 000 000 (unset, empty or 0: no
//!   hook);
//! * `ROCE_LINK_DROP_SEED`: the generator's seed (default 1);
//! * `ROCE_LINK_DROP_DIRECTIONS`: `both` (default), `send` or `receive`.
//!
//! [`OpenOptions::drop`]: crate::open::OpenOptions::drop

use crate::link::udp::{DropDirections, DropHook};

/// The environment variable with the drop rate, datagrams per million (0 or unset: no hook).
pub const PPM_VAR: &str = "ROCE_LINK_DROP_PPM";
/// The environment variable with the generator's seed (default 1).
pub const SEED_VAR: &str = "ROCE_LINK_DROP_SEED";
/// The environment variable with the directions: `both` (default), `send` or `receive`.
pub const DIRECTIONS_VAR: &str = "ROCE_LINK_DROP_DIRECTIONS";

/// The hook the environment asks for: `Ok(None)` when [`PPM_VAR`] is unset, empty or 0.
///
/// # Errors
/// A message naming the variable when a value is not a number or the rate is above 1 000 000.
pub fn drop_hook_from_env() -> Result<Option<DropHook>, &'static str> {
    let ppm = match std::env::var(PPM_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&p| p <= 1_000_000)
            .ok_or(
            "ROCE_LINK_DROP_PPM must be a number of datagrams per million, 0 ..= 1000000",
        )?,
        _ => 0,
    };
    if ppm == 0 {
        return Ok(None);
    }
    let seed = match std::env::var(SEED_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map_err(|_| "ROCE_LINK_DROP_SEED must be an unsigned 64-bit number")?,
        _ => 1,
    };
    let directions = match std::env::var(DIRECTIONS_VAR) {
        Ok(v) => match v.trim() {
            "" | "both" => DropDirections::Both,
            "send" => DropDirections::Send,
            "receive" => DropDirections::Receive,
            _ => return Err("ROCE_LINK_DROP_DIRECTIONS must be both, send or receive"),
        },
        Err(_) => DropDirections::Both,
    };
    Ok(Some(DropHook {
        ppm,
        seed,
        directions,
    }))
}
