//! Object tables: the slabs that hold every PD, MR, CQ, SRQ, AH and QP of a device.
//!
//! `ObjectTable` stores objects in a `Vec` indexed by a small integer (the slot), so every
//! lookup is O(1), and keeps a *generation* per slot that changes each time the slot is freed: a
//! handle that carries an old generation no longer resolves, even after the slot is reused. PDs,
//! CQs, SRQs and AHs are named by their slot (a program keeps the handle; no peer sees it).
//!
//! QPs and MRs are named by numbers a peer sees on the wire (the QPN in the BTH, the rkey in the
//! RETH), and an off-path attacker who can guess them can forge requests (see [`crate::verbs::mr`]
//! and [`crate::verbs::qp`] for the arithmetic). `KeyedTable` therefore names each object by a
//! number drawn from a [`RandomSource`] (never the slot, a counter or a clock), unique among the
//! live objects and different from the number the same slot carried last, and finds the slot
//! through an `IdMap` (open addressing keyed by that number): create, lookup and destroy stay
//! O(1) in the number of live objects (amortized: the map doubles as it fills).
//!
//! Freed slots are reused first-in first-out, and only once more than [`REUSE_DELAY`] of them are
//! free (or the table is at its limit), so that a just-freed handle's slot is not handed out
//! again at once (rxe allocates its indices cyclically for the same reason).

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;
use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

use crate::verbs::error::{Cause, Object};
use crate::verbs::random::RandomSource;

/// Freed slots are reused only once more than this many are free (or the table is full).
pub const REUSE_DELAY: usize = 64;

/// A typed handle to an object of kind `T` in a device's table: the slot index and the slot's
/// generation when the object was created.
///
/// A handle is plain data: copying it does not keep the object alive. Once the object is
/// destroyed the handle no longer resolves (its generation is stale), even if the index is reused.
pub struct Handle<T> {
    index: u32,
    generation: u32,
    kind: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// Builds a handle from its parts, e.g. when it crossed an FFI boundary as two integers.
    pub const fn from_raw(index: u32, generation: u32) -> Self {
        Handle {
            index,
            generation,
            kind: PhantomData,
        }
    }

    /// The slot index (what verbs call the object number: PD / CQ / SRQ / AH index, QPN).
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The slot generation the handle was issued with.
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Handle<T> {}

impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index && self.generation == other.generation
    }
}

impl<T> Eq for Handle<T> {}

impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.index.hash(state);
        self.generation.hash(state);
    }
}

impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle({}, gen {})", self.index, self.generation)
    }
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A slab of objects with O(1) lookup by index and a generation per slot.
pub(crate) struct ObjectTable<T> {
    slots: Vec<Slot<T>>,
    /// Free slot positions, oldest first.
    free: VecDeque<u32>,
    /// The index of slot 0 (objects are numbered from `base`; rxe starts QPNs at 16, MRs at 1).
    base: u32,
    /// The most live objects allowed.
    max: u32,
    live: u32,
}

/// The first generation of a fresh slot: scrambled so that handles of neighbouring slots differ
/// in more than the index.
fn initial_generation(position: u32) -> u32 {
    position.wrapping_add(1).wrapping_mul(0x9E37_79B9) >> 8
}

impl<T> ObjectTable<T> {
    /// An empty table numbering objects from `base`, holding at most `max` live objects.
    pub(crate) fn new(base: u32, max: u32) -> Self {
        ObjectTable {
            slots: Vec::new(),
            free: VecDeque::new(),
            base,
            max,
            live: 0,
        }
    }

    /// The limit on live objects.
    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    /// Live objects.
    pub(crate) fn len(&self) -> u32 {
        self.live
    }

    /// The slot position the next [`Self::insert`] will use (a new slot is `slots.len()`), or
    /// `None` when the table is full.
    pub(crate) fn next_position(&self) -> Option<u32> {
        if self.live >= self.max {
            return None;
        }
        let grow = self.free.len() <= REUSE_DELAY
            && (self.slots.len() as u64) < u64::from(self.max)
            && u64::from(self.base) + (self.slots.len() as u64) <= u64::from(u32::MAX);
        if grow {
            Some(self.slots.len() as u32)
        } else {
            self.free.front().copied()
        }
    }

    /// Stores `value` and returns its handle, or gives `value` back when the table is full.
    pub(crate) fn insert(&mut self, value: T) -> Result<Handle<T>, T> {
        let Some(position) = self.next_position() else {
            return Err(value);
        };
        if position as usize == self.slots.len() {
            self.slots.push(Slot {
                generation: initial_generation(position),
                value: None,
            });
        } else {
            self.free.pop_front();
        }
        let slot = &mut self.slots[position as usize];
        slot.value = Some(value);
        self.live += 1;
        Ok(Handle::from_raw(self.base + position, slot.generation))
    }

    fn position(&self, index: u32) -> Option<usize> {
        let position = index.checked_sub(self.base)? as usize;
        (position < self.slots.len()).then_some(position)
    }

    /// The object at `index` and the slot's current generation, without a generation check.
    pub(crate) fn get_by_index(&self, index: u32) -> Option<(u32, &T)> {
        let slot = &self.slots[self.position(index)?];
        slot.value.as_ref().map(|v| (slot.generation, v))
    }

    /// Mutable form of [`Self::get_by_index`].
    pub(crate) fn get_by_index_mut(&mut self, index: u32) -> Option<(u32, &mut T)> {
        let position = self.position(index)?;
        let slot = &mut self.slots[position];
        let generation = slot.generation;
        slot.value.as_mut().map(|v| (generation, v))
    }

    /// The object a handle names, if it is still live.
    pub(crate) fn get(&self, handle: Handle<T>) -> Option<&T> {
        match self.get_by_index(handle.index)? {
            (generation, value) if generation == handle.generation => Some(value),
            _ => None,
        }
    }

    /// Mutable form of [`Self::get`].
    pub(crate) fn get_mut(&mut self, handle: Handle<T>) -> Option<&mut T> {
        match self.get_by_index_mut(handle.index)? {
            (generation, value) if generation == handle.generation => Some(value),
            _ => None,
        }
    }

    /// Removes the object a handle names; its slot's generation changes at once.
    pub(crate) fn remove(&mut self, handle: Handle<T>) -> Option<T> {
        let position = self.position(handle.index)?;
        let slot = &mut self.slots[position];
        if slot.generation != handle.generation {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push_back(position as u32);
        self.live -= 1;
        Some(value)
    }

    /// What a create verb refuses with when [`Self::insert`] finds the table full: `object`s
    /// beyond [`Self::max`] (`ENOMEM`, as the device attributes' `max_pd`, `max_cq`, ... say).
    pub(crate) fn too_many(&self, object: Object) -> Cause {
        Cause::TooManyObjects {
            object,
            max: self.max(),
        }
    }

    /// Takes the object `handle` names out for a destroy verb: [`Cause::NoSuchObject`] (as
    /// `object`) when the table holds none, else [`Cause::InUse`] while `users` objects still use
    /// it (`EBUSY`, as ibv_dealloc_pd(3), ibv_destroy_cq(3) and ibv_destroy_srq(3) refuse).
    pub(crate) fn take_unused(
        &mut self,
        handle: Handle<T>,
        object: Object,
        users: usize,
    ) -> Result<T, Cause> {
        let no_such = Cause::NoSuchObject {
            object,
            id: handle.index,
        };
        if self.get(handle).is_none() {
            return Err(no_such);
        }
        if users > 0 {
            return Err(Cause::InUse {
                users: users as u32,
            });
        }
        self.remove(handle).ok_or(no_such)
    }

    /// The live objects with their handles, in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle<T>, &T)> + '_ {
        let base = self.base;
        self.slots.iter().enumerate().filter_map(move |(i, slot)| {
            slot.value
                .as_ref()
                .map(|v| (Handle::from_raw(base + i as u32, slot.generation), v))
        })
    }
}

/// An open-addressing hash map from a nonzero `u32` id (a QPN, an MR key) to a slot position:
/// linear probing over a power-of-two array kept at most half full, Fibonacci hashing of the id,
/// deletion by backward shift (no tombstones). Insert, lookup and remove are O(1) expected
/// (insert amortized over the doublings).
///
/// Ids are drawn at random by this crate, so a peer cannot pick ids that collide; a peer only
/// looks up ids, and a lookup of an absent id stops at the first empty bucket.
pub(crate) struct IdMap {
    /// `(id, position)`; id 0 marks an empty bucket.
    buckets: Vec<(u32, u32)>,
    len: usize,
}

impl IdMap {
    const MIN_BUCKETS: usize = 16;

    pub(crate) fn new() -> Self {
        IdMap {
            buckets: Vec::new(),
            len: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn home(&self, id: u32) -> usize {
        let bits = self.buckets.len().trailing_zeros();
        ((u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> (64 - bits)) as usize
    }

    fn find(&self, id: u32) -> Option<usize> {
        if id == 0 || self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(id);
        loop {
            match self.buckets[i].0 {
                0 => return None,
                x if x == id => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The position stored for `id`.
    pub(crate) fn get(&self, id: u32) -> Option<u32> {
        self.find(id).map(|i| self.buckets[i].1)
    }

    /// Whether `id` is present.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.find(id).is_some()
    }

    fn place(&mut self, id: u32, position: u32) {
        let mask = self.buckets.len() - 1;
        let mut i = self.home(id);
        while self.buckets[i].0 != 0 {
            i = (i + 1) & mask;
        }
        self.buckets[i] = (id, position);
    }

    /// Stores `id -> position`; `id` must be nonzero and absent (the caller checked).
    pub(crate) fn insert(&mut self, id: u32, position: u32) {
        debug_assert!(id != 0 && !self.contains(id));
        if (self.len + 1) * 2 > self.buckets.len() {
            let size = (self.buckets.len() * 2).max(Self::MIN_BUCKETS);
            let old = core::mem::replace(&mut self.buckets, alloc::vec![(0, 0); size]);
            for (k, v) in old.into_iter().filter(|&(k, _)| k != 0) {
                self.place(k, v);
            }
        }
        self.place(id, position);
        self.len += 1;
    }

    /// Removes `id`, returning its position.
    pub(crate) fn remove(&mut self, id: u32) -> Option<u32> {
        let mut hole = self.find(id)?;
        let position = self.buckets[hole].1;
        let mask = self.buckets.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let (k, _) = self.buckets[j];
            if k == 0 {
                break;
            }
            // The entry at `j` may fill the hole unless its home lies cyclically in (hole, j].
            let home = self.home(k);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.buckets[hole] = self.buckets[j];
                hole = j;
            }
        }
        self.buckets[hole] = (0, 0);
        self.len -= 1;
        Some(position)
    }
}

/// Draws after which [`KeyedTable::insert`] stops drawing and walks up from its last draw to the
/// next free id (never reached in practice: the tables keep the live ids a small fraction of the
/// id space, so a draw fails with probability at most 1/16).
const MAX_DRAWS: u32 = 64;

/// A slab of objects named by random ids: see the [module docs](self).
pub(crate) struct KeyedTable<T> {
    slots: ObjectTable<T>,
    ids: IdMap,
    /// The id each slot carries now (live) or carried last (free; 0 if never used).
    slot_ids: Vec<u32>,
    /// Ids are `random & mask`, at least `min`.
    mask: u32,
    min: u32,
    /// Bits every id carries as `fixed` ([`KeyedTable::set_fixed`]); 0: none.
    fixed_mask: u32,
    fixed: u32,
}

impl<T> KeyedTable<T> {
    /// An empty table of at most `max` live objects named by ids in `[min, mask]` (`min >= 1`;
    /// `mask` of the form `2^k - 1`). The caller keeps `max` a small fraction of the id space.
    pub(crate) fn new(max: u32, min: u32, mask: u32) -> Self {
        debug_assert!(min >= 1 && mask.wrapping_add(1) & mask == 0);
        KeyedTable {
            slots: ObjectTable::new(0, max),
            ids: IdMap::new(),
            slot_ids: Vec::new(),
            mask,
            min,
            fixed_mask: 0,
            fixed: 0,
        }
    }

    /// Makes every id drawn from now on carry `value` in the bits of `fixed_mask` (the rest stay
    /// random): a shared device's QPN prefix ([`crate::link::udp::share`]). `value` outside
    /// `fixed_mask` is ignored.
    pub(crate) fn set_fixed(&mut self, fixed_mask: u32, value: u32) {
        self.fixed_mask = fixed_mask & self.mask;
        self.fixed = value & self.fixed_mask;
    }

    fn shape(&self, raw: u32) -> u32 {
        (raw & self.mask & !self.fixed_mask) | self.fixed
    }

    /// The limit on live objects.
    pub(crate) fn max(&self) -> u32 {
        self.slots.max()
    }

    /// Live objects.
    pub(crate) fn len(&self) -> u32 {
        self.slots.len()
    }

    fn usable(&self, id: u32, position: usize) -> bool {
        id >= self.min && !self.ids.contains(id) && self.slot_ids.get(position) != Some(&id)
    }

    /// Draws a fresh id from `random` and stores `make(id, slot)` under it. The id is in
    /// `[min, mask]`, names no live object, and differs from the id the same slot carried last.
    /// Returns `Ok(None)` when the table is full; `make`'s error leaves the table unchanged.
    pub(crate) fn insert<E>(
        &mut self,
        random: &mut dyn RandomSource,
        make: impl FnOnce(u32, u32) -> Result<T, E>,
    ) -> Result<Option<(u32, &mut T)>, E> {
        let Some(position) = self.slots.next_position() else {
            return Ok(None);
        };
        // With fixed bits the id space shrinks: keep live objects at most 1/16 of it, so that
        // a draw is free with probability >= 15/16 and the sequential fallback ends.
        let space = u64::from(self.mask & !self.fixed_mask) + 1;
        if self.fixed_mask != 0 && u64::from(self.len()) >= space / 16 {
            return Ok(None);
        }
        let p = position as usize;
        let mut id = self.shape(random.next_u32());
        let mut draws = 1;
        while !self.usable(id, p) {
            id = if draws < MAX_DRAWS {
                draws += 1;
                self.shape(random.next_u32())
            } else {
                self.shape(id.wrapping_add(1))
            };
        }
        let value = make(id, position)?;
        let Ok(handle) = self.slots.insert(value) else {
            return Ok(None);
        };
        debug_assert_eq!(handle.index(), position);
        if self.slot_ids.len() <= p {
            self.slot_ids.resize(p + 1, 0);
        }
        self.slot_ids[p] = id;
        self.ids.insert(id, position);
        let value = self
            .slots
            .get_mut(handle)
            .expect("inserted just above, in the slot it named");
        Ok(Some((id, value)))
    }

    /// The slot position of the live object named `id`. O(1).
    pub(crate) fn slot(&self, id: u32) -> Option<u32> {
        self.ids.get(id)
    }

    /// The live object named `id`. O(1).
    pub(crate) fn get(&self, id: u32) -> Option<&T> {
        let (_, value) = self.slots.get_by_index(self.ids.get(id)?)?;
        Some(value)
    }

    /// Mutable form of [`Self::get`].
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        let (_, value) = self.slots.get_by_index_mut(self.ids.get(id)?)?;
        Some(value)
    }

    /// Removes the object named `id`; the id stops resolving at once. O(1).
    pub(crate) fn remove(&mut self, id: u32) -> Option<T> {
        let position = self.ids.get(id)?;
        let (generation, _) = self.slots.get_by_index(position)?;
        let value = self.slots.remove(Handle::from_raw(position, generation))?;
        self.ids.remove(id);
        Some(value)
    }

    /// The live objects with their ids, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> + '_ {
        self.slots
            .iter()
            .map(|(h, v)| (self.slot_ids[h.index() as usize], v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn stale_handles_do_not_resolve() {
        let mut t = ObjectTable::new(1, 4);
        let a = t.insert("a").unwrap();
        assert_eq!(a.index(), 1);
        assert_eq!(t.get(a), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn limit_is_enforced_and_slots_are_reused_when_full() {
        let mut t = ObjectTable::new(16, 2);
        let a = t.insert(1).unwrap();
        let b = t.insert(2).unwrap();
        assert_eq!((a.index(), b.index()), (16, 17));
        assert_eq!(t.insert(3), Err(3));
        t.remove(a).unwrap();
        let c = t.insert(3).unwrap();
        assert_eq!(c.index(), 16, "full table reuses the freed slot");
        assert_ne!(c.generation(), a.generation());
        assert_eq!(t.get(a), None);
        assert_eq!(t.get(c), Some(&3));
    }

    #[test]
    fn freed_indices_are_not_reused_at_once() {
        let mut t = ObjectTable::new(0, 10_000);
        let a = t.insert(0).unwrap();
        t.remove(a).unwrap();
        let b = t.insert(1).unwrap();
        assert_ne!(a.index(), b.index());
        // Free many: after REUSE_DELAY free slots the oldest freed one comes back first.
        let hs: Vec<_> = (0..REUSE_DELAY + 2).map(|i| t.insert(i).unwrap()).collect();
        for h in &hs {
            t.remove(*h).unwrap();
        }
        let c = t.insert(99).unwrap();
        assert_eq!(c.index(), a.index());
    }

    #[test]
    fn iter_lists_live_objects() {
        let mut t = ObjectTable::new(1, 8);
        let a = t.insert('a').unwrap();
        let b = t.insert('b').unwrap();
        t.remove(a).unwrap();
        let v: Vec<_> = t.iter().collect();
        assert_eq!(v, vec![(b, &'b')]);
    }

    proptest! {
        #[test]
        fn table_matches_a_map(ops in proptest::collection::vec((any::<bool>(), 0usize..16), 0..400)) {
            let mut t = ObjectTable::new(1, 12);
            let mut model: HashMap<u32, (Handle<u32>, u32)> = HashMap::new();
            let mut dead: Vec<Handle<u32>> = Vec::new();
            let mut next = 0u32;
            for (insert, pick) in ops {
                if insert {
                    match t.insert(next) {
                        Ok(h) => {
                            prop_assert!(model.len() < 12);
                            prop_assert!(model.insert(h.index(), (h, next)).is_none());
                        }
                        Err(v) => {
                            prop_assert_eq!(v, next);
                            prop_assert_eq!(model.len(), 12);
                        }
                    }
                    next += 1;
                } else if !model.is_empty() {
                    let key = *model.keys().nth(pick % model.len()).unwrap();
                    let (h, v) = model.remove(&key).unwrap();
                    prop_assert_eq!(t.remove(h), Some(v));
                    dead.push(h);
                }
                prop_assert_eq!(t.len() as usize, model.len());
                for (h, v) in model.values() {
                    prop_assert_eq!(t.get(*h), Some(v));
                }
                for h in &dead {
                    prop_assert!(t.get(*h).is_none());
                }
            }
        }
    }
    /// A counter "random source": the worst case for the map (sequential ids) and for the
    /// draw-until-usable loop (every id it draws next is taken or was the slot's last).
    struct Counter(u32);

    impl RandomSource for Counter {
        fn fill(&mut self, buf: &mut [u8]) {
            for b in buf.chunks_mut(4) {
                self.0 = self.0.wrapping_add(1);
                let n = b.len();
                b.copy_from_slice(&self.0.to_ne_bytes()[..n]);
            }
        }
    }

    #[test]
    fn keyed_table_ids_are_in_range_and_never_the_slots_last() {
        // A table of one over the ids 1 ..= 3: each insert must skip the slot's last id.
        let mut t: KeyedTable<u32> = KeyedTable::new(1, 1, 3);
        let mut r = Counter(0);
        let mut last = 0;
        for i in 0..50 {
            let (id, _) = t
                .insert(&mut r, |id, slot| Ok::<_, ()>(id + slot))
                .unwrap()
                .unwrap();
            assert!((1..=3).contains(&id));
            assert_ne!(id, last, "round {i}");
            assert_eq!(t.insert(&mut r, |_, _| Ok::<_, ()>(0)), Ok(None), "full");
            assert_eq!(t.remove(id), Some(id));
            assert_eq!(t.get(id), None);
            last = id;
        }
        // A failing constructor leaves nothing behind.
        assert_eq!(t.insert(&mut r, |_, _| Err::<u32, _>(7)), Err(7));
        assert_eq!(t.len(), 0);
    }

    proptest! {
        #[test]
        fn id_map_matches_a_map(ops in proptest::collection::vec((any::<bool>(), 1u32..200), 0..600)) {
            let mut m = IdMap::new();
            let mut model: HashMap<u32, u32> = HashMap::new();
            for (n, (insert, id)) in ops.into_iter().enumerate() {
                if insert {
                    if let std::collections::hash_map::Entry::Vacant(e) = model.entry(id) {
                        m.insert(id, n as u32);
                        e.insert(n as u32);
                    }
                } else {
                    prop_assert_eq!(m.remove(id), model.remove(&id));
                }
                prop_assert_eq!(m.len(), model.len());
                for k in 0..200 {
                    prop_assert_eq!(m.get(k), model.get(&k).copied());
                }
            }
        }

        #[test]
        fn keyed_table_matches_a_map(ops in proptest::collection::vec((any::<bool>(), 0usize..64), 0..400), sequential in any::<bool>()) {
            // Ids in 16 ..= 255 from a counter or the OS; at most 40 live.
            let mut t: KeyedTable<u32> = KeyedTable::new(40, 16, 255);
            let mut counter = Counter(0);
            let mut os = crate::verbs::random::OsRandom;
            let mut model: HashMap<u32, u32> = HashMap::new();
            let mut slot_last: HashMap<u32, u32> = HashMap::new();
            for (insert, pick) in ops {
                if insert {
                    let random: &mut dyn RandomSource = if sequential { &mut counter } else { &mut os };
                    match t.insert(random, |id, slot| Ok::<_, ()>(id ^ slot)).unwrap() {
                        Some((id, v)) => {
                            let slot = *v ^ id;
                            prop_assert!((16..=255).contains(&id));
                            prop_assert!(model.insert(id, slot).is_none(), "live id reused");
                            if let Some(last) = slot_last.insert(slot, id) {
                                prop_assert_ne!(last, id);
                            }
                        }
                        None => prop_assert_eq!(model.len(), 40),
                    }
                } else if !model.is_empty() {
                    let id = *model.keys().nth(pick % model.len()).unwrap();
                    let slot = model.remove(&id).unwrap();
                    prop_assert_eq!(t.remove(id), Some(id ^ slot));
                }
                prop_assert_eq!(t.len() as usize, model.len());
                for id in 0..300 {
                    prop_assert_eq!(t.get(id).map(|v| v ^ id), model.get(&id).copied());
                    prop_assert_eq!(t.slot(id), model.get(&id).copied());
                }
                let mut listed: Vec<_> = t.iter().map(|(id, _)| id).collect();
                listed.sort_unstable();
                let mut want: Vec<_> = model.keys().copied().collect();
                want.sort_unstable();
                prop_assert_eq!(listed, want);
            }
        }
    }
}
