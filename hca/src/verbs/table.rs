//! Object tables: the slab that holds every PD, MR, CQ, SRQ, AH and QP of a device.
//!
//! Verbs objects are named by small integers that a peer may see on the wire (the QPN in the BTH,
//! the index part of an rkey in the RETH) or that a program keeps as a handle. A table stores the
//! objects in a `Vec` indexed by that integer, so every lookup is O(1), and keeps a *generation*
//! per slot that changes each time the slot is freed: a handle or key that carries an old
//! generation no longer resolves, even after the slot is reused.
//!
//! Freed slots are reused first-in first-out, and only once more than [`REUSE_DELAY`] of them are
//! free (or the table is at its limit), so that a just-destroyed QPN or MR index is not handed out
//! again at once (rxe allocates its indices cyclically for the same reason).

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;
use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

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

/// The first generation of a fresh slot: scrambled so that the low bits (an MR key byte) of
/// neighbouring slots differ (rxe picks a random key byte for the same reason).
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
    fn next_position(&self) -> Option<u32> {
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

    /// The handle the next [`Self::insert`] will return, for objects that must know their own
    /// number (a QP its QPN); `None` when the table is full.
    pub(crate) fn peek_next(&self) -> Option<Handle<T>> {
        let position = self.next_position()?;
        let generation = self
            .slots
            .get(position as usize)
            .map_or_else(|| initial_generation(position), |s| s.generation);
        Some(Handle::from_raw(self.base + position, generation))
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
    fn peek_predicts_insert() {
        let mut t = ObjectTable::new(16, 3);
        for i in 0..200u32 {
            let peek = t.peek_next();
            match t.insert(i) {
                Ok(h) => assert_eq!(peek, Some(h)),
                Err(_) => assert_eq!(peek, None),
            }
            if i % 3 == 0 {
                let (h, _) = t.iter().next().map(|(h, v)| (h, *v)).unwrap();
                t.remove(h).unwrap();
            }
        }
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
}
