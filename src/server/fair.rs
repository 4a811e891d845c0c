//! The order in which queued jobs start: round-robin between clients, each client's own jobs in the order
//! they came. A client that sends twenty requests at once then takes one free slot in turn with every other
//! client that waits, instead of holding all of them until its twenty are done.
//!
//! A client is the request's `user` field where it sends one (OpenAI's end-user id: an app that serves
//! several people passes theirs), otherwise the address it connects from. Every program on the machine
//! connects from loopback, so local programs that send no `user` share one lane and are served in order.
//!
//! This module owns only the lanes; the engine thread asks it for the next job to start.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, TryRecvError};

/// Who a job is for: the lane it waits in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// The request's `user` field.
    User(String),
    /// The peer's IP address (no port: one program opens many connections).
    Addr(std::net::IpAddr),
    /// Neither is known (a job submitted without a connection: tests).
    Unknown,
}

impl ClientKey {
    /// The lane of a request: its `user` field when it sends a non-empty one (its first 256 bytes), else
    /// the address it connected from.
    pub fn of(user: Option<&str>, peer: Option<Peer>) -> ClientKey {
        match (user.map(str::trim).filter(|u| !u.is_empty()), peer) {
            (Some(u), _) => {
                let end = (0..=u.len().min(256)).rev().find(|&i| u.is_char_boundary(i)).unwrap_or(0);
                ClientKey::User(u[..end].to_owned())
            }
            (None, Some(Peer(ip))) => ClientKey::Addr(ip),
            (None, None) => ClientKey::Unknown,
        }
    }
}

/// The address a request's connection comes from, put in its extensions by the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::IpAddr);

/// Something that waits in a lane.
pub trait Laned {
    fn client(&self) -> &ClientKey;
}

/// Lanes of waiting jobs; fed from the channel the HTTP side sends on. The next job comes from the lane
/// whose client was served least recently (a client never served, or not for a long time, first; among
/// equals, the lane that formed first), so a request that arrives while another client's many requests
/// run waits for at most one start per other waiting client.
pub struct FairQueue<J> {
    rx: Receiver<J>,
    /// Lanes with at least one job, in the order they formed.
    lanes: Vec<(ClientKey, VecDeque<J>)>,
    /// When each client's job last started (a count of starts); clients without a lane are forgotten past
    /// [`REMEMBERED`] entries.
    last_start: HashMap<ClientKey, u64>,
    starts: u64,
    /// The channel's senders are all gone.
    closed: bool,
}

/// How many clients' last start is kept before those with no waiting job are forgotten.
const REMEMBERED: usize = 1024;

impl<J: Laned> FairQueue<J> {
    pub fn new(rx: Receiver<J>) -> FairQueue<J> {
        FairQueue { rx, lanes: Vec::new(), last_start: HashMap::new(), starts: 0, closed: false }
    }

    /// The next job to take off the queue: waits for one when `wait` and none is queued. None: nothing is
    /// queued (and `wait` is false), or the channel is closed and every lane is empty. Its client's turn is
    /// counted by [`FairQueue::started`] once it really starts: a job dropped instead (its client left)
    /// costs the lane nothing.
    pub fn next(&mut self, wait: bool) -> Option<J> {
        self.drain();
        if self.lanes.is_empty() && wait && !self.closed {
            match self.rx.recv() {
                Ok(j) => self.push(j),
                Err(_) => self.closed = true,
            }
            self.drain();
        }
        let last = |k: &ClientKey| self.last_start.get(k).copied().unwrap_or(0);
        let (i, _) = self.lanes.iter().enumerate().min_by_key(|(i, (k, _))| (last(k), *i))?;
        let job = self.lanes[i].1.pop_front();
        if self.lanes[i].1.is_empty() {
            self.lanes.remove(i);
        }
        job
    }

    /// `client`'s job taken by [`FairQueue::next`] has started: the lane goes behind those served less
    /// recently.
    pub fn started(&mut self, client: &ClientKey) {
        self.starts += 1;
        self.last_start.insert(client.clone(), self.starts);
        if self.last_start.len() > REMEMBERED {
            let lanes = &self.lanes;
            self.last_start.retain(|k, _| k == client || lanes.iter().any(|(l, _)| l == k));
        }
    }

    /// Jobs queued in lanes (not counting those still in the channel).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lanes.iter().map(|(_, l)| l.len()).sum()
    }

    /// Moves every job already sent into its lane.
    fn drain(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(j) => self.push(j),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    fn push(&mut self, job: J) {
        match self.lanes.iter_mut().find(|(k, _)| k == job.client()) {
            Some((_, lane)) => lane.push_back(job),
            None => self.lanes.push((job.client().clone(), VecDeque::from([job]))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    struct J(ClientKey, u32);
    impl Laned for J {
        fn client(&self) -> &ClientKey {
            &self.0
        }
    }
    fn user(s: &str) -> ClientKey {
        ClientKey::User(s.into())
    }

    fn order(q: &mut FairQueue<J>) -> Vec<(String, u32)> {
        std::iter::from_fn(|| {
            let j = q.next(false)?;
            q.started(&j.0);
            Some(j)
        })
        .map(|J(k, n)| {
            let name = match k {
                ClientKey::User(u) => u,
                ClientKey::Addr(a) => a.to_string(),
                ClientKey::Unknown => "?".into(),
            };
            (name, n)
        })
        .collect()
    }

    #[test]
    fn a_client_with_many_jobs_takes_turns_with_the_others() {
        let (tx, rx) = channel();
        let mut q = FairQueue::new(rx);
        for n in 0..4 {
            tx.send(J(user("agent"), n)).unwrap();
        }
        tx.send(J(user("editor"), 0)).unwrap();
        tx.send(J(user("app"), 0)).unwrap();
        tx.send(J(user("editor"), 1)).unwrap();
        let got = order(&mut q);
        let want = [("agent", 0), ("editor", 0), ("app", 0), ("agent", 1), ("editor", 1), ("agent", 2), ("agent", 3)];
        assert_eq!(got, want.map(|(k, n)| (k.to_string(), n)));
    }

    #[test]
    fn one_client_alone_is_served_in_the_order_it_sent() {
        let (tx, rx) = channel();
        let mut q = FairQueue::new(rx);
        let local = ClientKey::Addr([127, 0, 0, 1].into());
        for n in 0..5 {
            tx.send(J(local.clone(), n)).unwrap();
        }
        let got: Vec<u32> = order(&mut q).into_iter().map(|(_, n)| n).collect();
        assert_eq!(got, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_job_sent_while_others_run_waits_one_turn_not_the_whole_queue() {
        let (tx, rx) = channel();
        let mut q = FairQueue::new(rx);
        for n in 0..3 {
            tx.send(J(user("agent"), n)).unwrap();
        }
        // The engine starts one job, then the editor's request comes.
        let first = q.next(false).expect("a job");
        q.started(&first.0);
        assert_eq!(first.1, 0);
        tx.send(J(user("editor"), 0)).unwrap();
        let got = order(&mut q);
        assert_eq!(got[0], ("editor".to_string(), 0), "{got:?}");
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn waiting_returns_a_job_sent_later_and_none_once_closed() {
        let (tx, rx) = channel();
        let mut q = FairQueue::new(rx);
        assert!(q.next(false).is_none());
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(J(ClientKey::Unknown, 9)).unwrap();
        });
        assert_eq!(q.next(true).map(|j| j.1), Some(9));
        t.join().unwrap();
        assert!(q.next(true).is_none(), "the sender is gone: no job will come");
    }

    #[test]
    fn a_job_dropped_before_it_starts_costs_its_lane_nothing() {
        let (tx, rx) = channel();
        let mut q = FairQueue::new(rx);
        for n in 0..2 {
            tx.send(J(user("agent"), n)).unwrap();
            tx.send(J(user("editor"), n)).unwrap();
        }
        // The agent's first job is taken but its client left: dropped, not started.
        assert_eq!(q.next(false).map(|j| (j.0, j.1)), Some((user("agent"), 0)));
        // The agent's lane still has the first turn.
        let got = order(&mut q);
        assert_eq!(got[0], ("agent".to_string(), 1), "{got:?}");
    }
}
