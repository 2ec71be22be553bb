//! The slot arithmetic of a shared device address ([`super::share`]), a leaf module so that
//! both the forwarding ([`super::share`]) and the CM routing ([`super::cm_route`]) use it
//! without importing each other.

/// Bits of the QPN (and, for the CM, of a Communication ID) that name the owning process's slot.
pub const SLOT_BITS: u32 = 5;
/// Processes that can share one device address and port: `2^SLOT_BITS`.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// Random bits left in a QPN drawn by a shared device: `24 - SLOT_BITS`.
pub const RANDOM_QPN_BITS: u32 = 24 - SLOT_BITS;
