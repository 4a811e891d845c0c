//! The conversation cache: parked sequences (tokens, checkpoints, KV rows) in host RAM, bounded by a slot
//! count and a byte budget, evicted least recently used first; lookup by longest common token prefix; the
//! restore gate (`gate`).
//!
//! It owns the snapshots and their exact host bytes; it never touches a device. A snapshot taken for a
//! restore is pinned (never evicted) until the restore succeeds (the snapshot leaves: it is the live
//! sequence now) or is refused (it stays, at its old LRU place, with the same bytes).

pub mod gate;

use crate::device::Allocation;
use crate::model::kv::KvSnapshot;
/// How much of a snapshot a restore brings back (its schema is telemetry's: events carry it).
pub use crate::telemetry::RestoreKind;

/// What the engine runs with: KV element type and layout. A snapshot only restores into the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvIdentity {
    pub model: String,
    pub kv_type: crate::model::KvType,
    pub n_layer: usize,
    pub kv_dim: usize,
}

/// A parked conversation.
pub struct Snapshot {
    pub id: u64,
    pub tokens: Vec<u32>,
    /// Positions a prefix of this snapshot may be restored at (recorded during prefill: every
    /// `CHECKPOINT_EVERY` tokens and at the end of each prompt).
    pub checkpoints: Vec<usize>,
    pub kv: KvSnapshot,
    /// The draft model's KV (speculative decoding), parked with the target's: its first `draft.len`
    /// positions are those of `tokens`.
    pub draft: Option<KvSnapshot>,
    pub identity: KvIdentity,
    /// The host ledger's entry for the snapshot's bytes.
    pub host: Option<Allocation>,
    /// When the conversation was parked (its last use: a parked conversation is not used until restored).
    pub parked_at: std::time::Instant,
    pinned: bool,
}

impl Snapshot {
    pub fn new(tokens: Vec<u32>, checkpoints: Vec<usize>, kv: KvSnapshot, identity: KvIdentity) -> Snapshot {
        Snapshot {
            id: 0,
            tokens,
            checkpoints,
            kv,
            draft: None,
            identity,
            host: None,
            parked_at: std::time::Instant::now(),
            pinned: false,
        }
    }

    /// Host bytes of the snapshot: the target's KV and the draft's.
    pub fn bytes(&self) -> u64 {
        self.kv.bytes() + self.draft.as_ref().map_or(0, KvSnapshot::bytes)
    }
}

/// The best restore for a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: u64,
    pub tokens: usize,
    pub kind: RestoreKind,
}

/// A snapshot that left the cache to make room.
#[derive(Clone, Debug)]
pub struct Evicted {
    pub tokens: usize,
    pub bytes: u64,
}

/// What `make_room` evicted, and the KV buffers of the largest evicted snapshot, for the next park to
/// write into (memory already touched; its ledger entry is gone with the snapshot).
pub struct Room {
    pub evicted: Vec<Evicted>,
    pub spare: Option<KvSnapshot>,
}

#[derive(Debug)]
pub enum ParkOutcome {
    Parked {
        evicted: Vec<Evicted>,
    },
    /// Larger than the whole budget, or no room without evicting the pinned snapshot: not parked.
    NoRoom {
        bytes: u64,
    },
    /// The cache has no slots.
    Disabled,
}

pub struct ConversationCache {
    pub slots: usize,
    pub budget_bytes: u64,
    /// Least recently used first.
    entries: Vec<Snapshot>,
    bytes: u64,
    evictions: u64,
    next_id: u64,
}

impl ConversationCache {
    pub fn new(slots: usize, budget_bytes: u64) -> ConversationCache {
        ConversationCache { slots, budget_bytes, entries: Vec::new(), bytes: 0, evictions: 0, next_id: 1 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Host bytes of every parked snapshot.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Ids, least recently used first.
    pub fn ids(&self) -> Vec<u64> {
        self.entries.iter().map(|s| s.id).collect()
    }

    /// Every parked snapshot, least recently used first.
    pub fn snapshots(&self) -> impl Iterator<Item = &Snapshot> {
        self.entries.iter()
    }

    pub fn get(&self, id: u64) -> Option<&Snapshot> {
        self.entries.iter().find(|s| s.id == id)
    }

    /// Evicts least recently used snapshots (never the pinned one) until `bytes` more fit the budget and a
    /// slot is free; None when that is impossible (nothing is evicted then).
    pub fn make_room(&mut self, bytes: u64) -> Option<Room> {
        if self.slots == 0 || bytes > self.budget_bytes {
            return None;
        }
        // Check first that evicting the unpinned snapshots would be enough.
        let pinned_bytes: u64 = self.entries.iter().filter(|s| s.pinned).map(|s| s.bytes()).sum();
        let pinned_count = self.entries.iter().filter(|s| s.pinned).count();
        if pinned_bytes + bytes > self.budget_bytes || pinned_count + 1 > self.slots {
            return None;
        }
        let mut evicted = Vec::new();
        let mut spare: Option<KvSnapshot> = None;
        while self.bytes + bytes > self.budget_bytes || self.entries.len() + 1 > self.slots {
            let i = self.entries.iter().position(|s| !s.pinned)?;
            let s = self.entries.remove(i);
            self.bytes -= s.bytes();
            self.evictions += 1;
            evicted.push(Evicted { tokens: s.tokens.len(), bytes: s.bytes() });
            if spare.as_ref().is_none_or(|k| k.bytes() < s.kv.bytes()) {
                spare = Some(s.kv);
            }
        }
        Some(Room { evicted, spare })
    }

    /// New limits (a session started with other settings takes this cache over): the least recently used
    /// snapshots leave until the rest fit. What left.
    pub fn set_limits(&mut self, slots: usize, budget_bytes: u64) -> Vec<Evicted> {
        self.slots = slots;
        self.budget_bytes = budget_bytes;
        let mut evicted = Vec::new();
        while self.entries.len() > slots || self.bytes > budget_bytes {
            let Some(i) = self.entries.iter().position(|s| !s.pinned) else { break };
            let s = self.entries.remove(i);
            self.bytes -= s.bytes();
            self.evictions += 1;
            evicted.push(Evicted { tokens: s.tokens.len(), bytes: s.bytes() });
        }
        evicted
    }

    /// Parks `snap` as the most recently used, evicting as needed (call `make_room` first to avoid
    /// copying a snapshot that cannot stay).
    pub fn park(&mut self, mut snap: Snapshot) -> ParkOutcome {
        if self.slots == 0 {
            return ParkOutcome::Disabled;
        }
        let bytes = snap.bytes();
        let Some(Room { evicted, .. }) = self.make_room(bytes) else { return ParkOutcome::NoRoom { bytes } };
        snap.id = self.next_id;
        snap.pinned = false;
        self.next_id += 1;
        self.bytes += bytes;
        self.entries.push(snap);
        ParkOutcome::Parked { evicted }
    }

    /// The snapshot that restores the most of `prompt` (more than `at_least` tokens), preferring the most
    /// recent on ties: the whole snapshot when the prompt extends it, else its longest checkpoint within the
    /// common prefix.
    pub fn lookup(&self, prompt: &[u32], identity: &KvIdentity, at_least: usize) -> Option<Candidate> {
        let mut best: Option<Candidate> = None;
        for s in self.entries.iter().rev().filter(|s| &s.identity == identity) {
            let common = s.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            let (tokens, kind) = if common == s.tokens.len() {
                (common, RestoreKind::Live)
            } else {
                // A sliding-window layer holds the keys of positions from `min_len` on only.
                let usable = |c: usize| c <= common && c >= s.kv.min_len;
                let at = s.checkpoints.iter().copied().filter(|&c| usable(c)).max().unwrap_or(0);
                (at, RestoreKind::Checkpoint)
            };
            if tokens > at_least && best.is_none_or(|b| tokens > b.tokens) {
                best = Some(Candidate { id: s.id, tokens, kind });
            }
        }
        best
    }

    /// Pins snapshot `id` against eviction (a restore is in flight).
    pub fn pin(&mut self, id: u64) {
        if let Some(s) = self.entries.iter_mut().find(|s| s.id == id) {
            s.pinned = true;
        }
    }

    /// Unpins `id`: the restore was refused; it keeps its place and bytes.
    pub fn unpin(&mut self, id: u64) {
        if let Some(s) = self.entries.iter_mut().find(|s| s.id == id) {
            s.pinned = false;
        }
    }

    /// Removes `id` (restored: it is the live sequence now).
    pub fn remove(&mut self, id: u64) -> Option<Snapshot> {
        let i = self.entries.iter().position(|s| s.id == id)?;
        let s = self.entries.remove(i);
        self.bytes -= s.bytes();
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::KvRows;
    use crate::model::KvType;

    fn ident() -> KvIdentity {
        KvIdentity { model: "m".into(), kv_type: KvType::Int8, n_layer: 1, kv_dim: 32 }
    }

    /// A snapshot of `tokens` with 34 bytes per position (one int8 row of 32 for K and V: 68 bytes).
    fn snap(tokens: &[u32], checkpoints: &[usize]) -> Snapshot {
        let n = tokens.len();
        let kv = KvSnapshot {
            ty: KvType::Int8,
            kv_dim: 32,
            len: n,
            layers: vec![(KvRows::Int8(vec![0; n * 34]), KvRows::Int8(vec![0; n * 34]))],
            firsts: vec![0],
            min_len: 0,
        };
        Snapshot::new(tokens.to_vec(), checkpoints.to_vec(), kv, ident())
    }

    #[test]
    fn lru_eviction_by_slots_and_bytes() {
        let mut c = ConversationCache::new(2, 68 * 10);
        assert!(matches!(c.park(snap(&[1, 2, 3], &[])), ParkOutcome::Parked { .. }));
        assert!(matches!(c.park(snap(&[4, 5], &[])), ParkOutcome::Parked { .. }));
        let ParkOutcome::Parked { evicted } = c.park(snap(&[6], &[])) else { panic!() };
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].tokens, 3, "the least recently used went");
        assert_eq!((c.len(), c.bytes(), c.evictions()), (2, 68 * 3, 1));
        let ParkOutcome::Parked { evicted } = c.park(snap(&[7; 9], &[])) else { panic!() };
        assert_eq!(evicted.len(), 1, "bytes: 9 + 2 + 1 positions exceed 10; 9 + 1 fit");
        assert_eq!(c.bytes(), 68 * 10);
        assert!(matches!(c.park(snap(&[8; 11], &[])), ParkOutcome::NoRoom { .. }));
        assert!(c.bytes() <= c.budget_bytes);
        assert!(matches!(ConversationCache::new(0, 1 << 20).park(snap(&[1], &[])), ParkOutcome::Disabled));
    }

    #[test]
    fn lookup_prefers_the_longest_restore_and_pins_hold() {
        let mut c = ConversationCache::new(3, 1 << 20);
        c.park(snap(&[1, 2, 3, 4, 5, 6], &[2, 4]));
        c.park(snap(&[1, 2, 9], &[]));
        let id_a = c.ids()[0];
        let cand = c.lookup(&[1, 2, 3, 4, 5, 6, 7], &ident(), 0).unwrap();
        assert_eq!((cand.id, cand.tokens, cand.kind), (id_a, 6, RestoreKind::Live));
        let cand = c.lookup(&[1, 2, 3, 4, 5, 0], &ident(), 0).unwrap();
        assert_eq!((cand.tokens, cand.kind), (4, RestoreKind::Checkpoint));
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5, 0], &ident(), 4), None);
        let cand = c.lookup(&[1, 2, 9, 9], &ident(), 0).unwrap();
        assert_eq!((cand.tokens, cand.kind), (3, RestoreKind::Live));
        let other = KvIdentity { kv_type: KvType::F16, ..ident() };
        assert_eq!(c.lookup(&[1, 2, 9, 9], &other, 0), None);

        // A pinned snapshot is never evicted; room that would need it is refused.
        let mut c = ConversationCache::new(2, 68 * 8);
        c.park(snap(&[1; 5], &[]));
        let pinned = c.ids()[0];
        c.pin(pinned);
        assert!(matches!(c.park(snap(&[2; 4], &[])), ParkOutcome::NoRoom { .. }));
        assert!(matches!(c.park(snap(&[2; 3], &[])), ParkOutcome::Parked { .. }));
        let ParkOutcome::Parked { evicted } = c.park(snap(&[3; 2], &[])) else { panic!() };
        assert_eq!(evicted[0].tokens, 3);
        assert_eq!(c.ids()[0], pinned, "the pinned snapshot kept its LRU place");
        c.unpin(pinned);
        assert_eq!(c.remove(pinned).unwrap().tokens.len(), 5);
        assert_eq!(c.bytes(), 68 * 2);
    }
}
