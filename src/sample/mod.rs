//! Token sampling: picks the next token from a logits vector, and the helpers around it (log-probabilities
//! of the top tokens, stop-string detection over streamed text).
//!
//! It owns the sampling chain and its random state, and nothing else: it never runs the model, never
//! decodes tokens to text and never allocates per vocabulary entry more than one candidate list. The chain
//! follows llama.cpp's default order so that a given configuration means the same thing in both:
//!
//! ```text
//! penalties -> top_k -> top_p -> min_p -> temperature -> draw
//! ```
//!
//! Banned ids are removed before the chain starts, so no step can bring them back.

pub mod defaults;
mod rng;

use std::collections::HashMap;

use rng::SamplerRng;

/// How to pick tokens. Each filter has an "off" value; `Default` is llama.cpp's default chain.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Logits are divided by this before the draw. `<= 0` means greedy: the highest logit wins (the lowest
    /// id among equals) and no random number is drawn.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; 0 turns the filter off.
    pub top_k: usize,
    /// Keep the smallest set of highest-probability tokens whose probabilities sum to at least `top_p`;
    /// 1 turns the filter off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely token's; 0 turns it off.
    pub min_p: f32,
    /// Divide positive logits by this (multiply negative ones) for tokens seen in the last
    /// `repeat_last_n` tokens of the history; 1 turns it off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the three penalties look at; 0 turns all three off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token present in the penalty window; 0 turns it off.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of a token seen `count` times in the window; 0 turns it off.
    pub frequency_penalty: f32,
    /// Seed of the random stream: the same seed, logits and history give the same tokens, and the stream is
    /// llama.cpp's for that seed (MT19937, see `rng`).
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off over a
    /// window of 64), except the seed: llama.cpp draws a random one, Strata uses 0 so that runs are
    /// reproducible unless the caller asks otherwise.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: temperature 0, every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..SamplerConfig::default()
        }
    }

    /// True when the chain always picks the most likely token (no random number is drawn).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }
}

/// A token candidate: id and (penalised, filtered, scaled) logit.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Picks tokens with one configuration and one random stream.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: SamplerRng,
    /// Reused between calls so that sampling does not allocate a vocabulary-sized list per token.
    candidates: Vec<Candidate>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = SamplerRng::new(cfg.seed);
        Sampler { cfg, rng, candidates: Vec::new() }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary entry). `history` is every token so far
    /// (prompt and output, oldest first); the penalties look at its last `repeat_last_n`. Ids in `banned`
    /// are never returned; ids outside the vocabulary are ignored there.
    ///
    /// # Panics
    /// When no token is eligible: `logits` is empty, or every id is banned or NaN. Use [`Sampler::try_sample`]
    /// where that can happen.
    pub fn sample(&mut self, logits: &[f32], history: &[u32], banned: &[u32]) -> u32 {
        match self.try_sample(logits, history, banned) {
            Some(id) => id,
            None => panic!("no token can be sampled: {} logits, all banned or NaN", logits.len()),
        }
    }

    /// [`Sampler::sample`], or `None` when no token is eligible.
    pub fn try_sample(&mut self, logits: &[f32], history: &[u32], banned: &[u32]) -> Option<u32> {
        if self.cfg.is_greedy() && !self.cfg.penalties_on() && banned.is_empty() {
            // The argmax in one pass over the logits (the candidate list would give the same id: the
            // highest logit, the lowest id among equals, NaN never).
            return argmax(logits);
        }
        let mut cands = self.eligible(logits, history, banned);
        let picked =
            self.filtered(&mut cands).map(
                |()| {
                    if self.cfg.is_greedy() {
                        cands[0].id
                    } else {
                        draw(&cands, &mut self.rng)
                    }
                },
            );
        self.candidates = cands;
        picked
    }

    /// The distribution the chain draws from after `logits` (penalties, bans, filters and temperature
    /// applied): `(id, probability)` pairs, most likely first, summing to 1. Greedy: the argmax alone.
    /// Speculative sampling needs it to accept a draft with probability `p / q`.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32], banned: &[u32]) -> Option<Vec<(u32, f64)>> {
        let mut cands = self.eligible(logits, history, banned);
        let dist = self.filtered(&mut cands).map(|()| {
            let probs = probabilities(&cands);
            cands.iter().zip(probs).map(|(c, p)| (c.id, p)).filter(|&(_, p)| p > 0.0).collect()
        });
        self.candidates = cands;
        dist
    }

    /// A uniform number in [0, 1) from the sampler's stream (speculative sampling's acceptance test).
    pub fn uniform(&mut self) -> f64 {
        self.rng.uniform()
    }

    /// Draws an id from `dist` (`(id, probability)` pairs summing to 1) with the sampler's stream.
    pub fn draw_from(&mut self, dist: &[(u32, f64)]) -> Option<u32> {
        let u = self.rng.uniform();
        let mut cum = 0.0;
        for &(id, q) in dist {
            cum += q;
            if q > 0.0 && cum >= u {
                return Some(id);
            }
        }
        dist.iter().rev().find(|&&(_, q)| q > 0.0).map(|&(id, _)| id)
    }

    /// The penalised, unbanned candidates of `logits` (in the reused list, indexed by id).
    fn eligible(&mut self, logits: &[f32], history: &[u32], banned: &[u32]) -> Vec<Candidate> {
        let mut cands = std::mem::take(&mut self.candidates);
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }));
        if self.cfg.penalties_on() {
            let start = history.len().saturating_sub(self.cfg.repeat_last_n);
            apply_penalties(&mut cands, &history[start..], &self.cfg);
        }
        for &id in banned {
            if let Some(c) = cands.get_mut(id as usize) {
                c.logit = f32::NAN;
            }
        }
        // NaN marks a banned id (and a NaN logit is no evidence for a token either).
        cands.retain(|c| !c.logit.is_nan());
        cands
    }

    /// Runs the filters over the candidates and scales them for the draw. Greedy (and top_k = 1, which
    /// keeps only the argmax: no filter can change the outcome) leaves the argmax alone. None when nothing
    /// is eligible.
    fn filtered(&self, cands: &mut Vec<Candidate>) -> Option<()> {
        let cfg = &self.cfg;
        if cfg.is_greedy() {
            let best = cands.iter().copied().reduce(|best, c| if before(&c, &best) { c } else { best })?;
            cands.clear();
            cands.push(Candidate { id: best.id, logit: 0.0 });
            return Some(());
        }
        if cands.is_empty() {
            return None;
        }
        top_k(cands, cfg.top_k);
        top_p(cands, cfg.top_p);
        min_p(cands, cfg.min_p);
        // Scaled relative to the best logit, so that a tiny temperature gives -inf, never inf - inf.
        let (max, inv_t) = (cands[0].logit, 1.0 / cfg.temperature);
        for c in cands.iter_mut() {
            c.logit = if c.logit == max { 0.0 } else { (c.logit - max) * inv_t };
        }
        Some(())
    }
}

/// Speculative sampling's residual after a rejected draft: `max(0, p - q)` renormalized (Leviathan et al.,
/// 2023), so that accepting with probability `min(1, p(d) / q(d))` and otherwise drawing from this gives
/// exactly the distribution `p`. `p` and `q` are `(id, probability)` lists; when nothing is left (`p`
/// equals `q`), `p` itself.
pub fn residual(p: &[(u32, f64)], q: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let mut r: Vec<(u32, f64)> =
        p.iter().map(|&(id, x)| (id, (x - prob_in(q, id)).max(0.0))).filter(|&(_, x)| x > 0.0).collect();
    let sum: f64 = r.iter().map(|&(_, x)| x).sum();
    if sum <= 0.0 {
        return p.to_vec();
    }
    r.iter_mut().for_each(|(_, x)| *x /= sum);
    r
}

/// The probability of `id` in a `(id, probability)` list (0 when absent).
pub fn prob_in(dist: &[(u32, f64)], id: u32) -> f64 {
    dist.iter().find(|&&(i, _)| i == id).map_or(0.0, |&(_, x)| x)
}

/// The id of the highest non-NaN logit, the lowest id among equals; None when every logit is NaN.
fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Candidate order: higher logit first, then lower id. Total over non-NaN logits.
fn before(a: &Candidate, b: &Candidate) -> bool {
    a.logit > b.logit || (a.logit == b.logit && a.id < b.id)
}

fn cmp_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// llama.cpp's penalties over the tokens of `window`: a token seen `n` times has its logit divided by
/// `repeat_penalty` if positive (multiplied if not), then lowered by `n * frequency + presence`.
/// `cands` is still indexed by id here.
fn apply_penalties(cands: &mut [Candidate], window: &[u32], cfg: &SamplerConfig) {
    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(window.len());
    for &t in window {
        *counts.entry(t).or_insert(0) += 1;
    }
    for (&id, &n) in &counts {
        let Some(c) = cands.get_mut(id as usize) else {
            continue;
        };
        if c.logit <= 0.0 {
            c.logit *= cfg.repeat_penalty;
        } else {
            c.logit /= cfg.repeat_penalty;
        }
        c.logit -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
    }
}

/// Keeps the `k` best candidates, sorted best first; with `k == 0` (off) sorts them all. Every later
/// step relies on the sort.
fn top_k(cands: &mut Vec<Candidate>, k: usize) {
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, cmp_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(cmp_desc);
}

/// Softmax probabilities (f64) of sorted candidates at temperature 1.
fn probabilities(cands: &[Candidate]) -> Vec<f64> {
    let max = cands[0].logit as f64;
    // `x == max` first: with an infinite max, `x - max` would be NaN for the tokens that share it.
    let mut p: Vec<f64> =
        cands.iter().map(|c| if c.logit as f64 == max { 1.0 } else { (c.logit as f64 - max).exp() }).collect();
    let sum: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= sum);
    p
}

/// Keeps the shortest prefix of the sorted candidates whose probability reaches `p` (at least one).
fn top_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    let probs = probabilities(cands);
    let mut cum = 0.0;
    let mut keep = cands.len();
    for (i, &q) in probs.iter().enumerate() {
        cum += q;
        if cum >= p as f64 {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep);
}

/// Drops candidates less likely than `p` times the best one: `logit < max + ln p`.
fn min_p(cands: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let floor = cands[0].logit + p.ln();
    // Sorted, so the kept ones are a prefix; the best one always stays.
    let keep = cands.iter().take_while(|c| c.logit >= floor).count().max(1);
    cands.truncate(keep);
}

/// Draws one candidate with probability softmax(logit), as llama.cpp's `dist` does: the first candidate
/// (best first) at which the running sum of probabilities reaches the uniform number.
fn draw(cands: &[Candidate], rng: &mut SamplerRng) -> u32 {
    let probs = probabilities(cands);
    let u = rng.uniform();
    let mut cum = 0.0;
    for (c, &q) in cands.iter().zip(&probs) {
        cum += q;
        if q > 0.0 && cum >= u {
            return c.id;
        }
    }
    // Rounding left `u` just above the total: the draw landed on the last candidate that can be drawn.
    let last = probs.iter().rposition(|&q| q > 0.0).unwrap_or(0);
    cands[last].id
}

/// Natural-log softmax over the whole vocabulary, computed in f64 (max-subtracted log-sum-exp), and the
/// `k` most likely ids with their log-probabilities, most likely first (lower id first among equals).
/// NaN logits count as impossible (`-inf`).
pub fn log_softmax_top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let clean = |x: f32| {
        if x.is_nan() {
            f64::NEG_INFINITY
        } else {
            x as f64
        }
    };
    let max = logits.iter().map(|&x| clean(x)).fold(f64::NEG_INFINITY, f64::max);
    // log p = x - lse. An infinite max has no finite normaliser: the tokens at +inf share the mass
    // (log p = -ln count) and every other token is impossible; with all at -inf, all are impossible.
    let lse = if max.is_finite() {
        max + logits.iter().map(|&x| (clean(x) - max).exp()).sum::<f64>().ln()
    } else {
        f64::INFINITY
    };
    let n_at_max = logits.iter().filter(|&&x| clean(x) == max).count() as f64;
    let logp = |x: f64| {
        if max.is_finite() {
            x - lse
        } else if max == f64::INFINITY && x == max {
            -n_at_max.ln()
        } else {
            f64::NEG_INFINITY
        }
    };
    let mut cands: Vec<Candidate> =
        logits.iter().enumerate().map(|(i, &x)| Candidate { id: i as u32, logit: clean(x) as f32 }).collect();
    let k = k.min(cands.len());
    if k == 0 {
        return Vec::new();
    }
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, cmp_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(cmp_desc);
    cands.iter().map(|c| (c.id, logp(clean(logits[c.id as usize])) as f32)).collect()
}

/// The natural-log probability of `id` under the softmax of `logits` (f64 log-sum-exp, NaN as `-inf`), the
/// figure [`log_softmax_top_k`] gives for it.
pub fn log_prob_of(logits: &[f32], id: u32) -> f32 {
    let clean = |x: f32| if x.is_nan() { f64::NEG_INFINITY } else { x as f64 };
    let Some(&x) = logits.get(id as usize) else { return f32::NEG_INFINITY };
    let max = logits.iter().map(|&v| clean(v)).fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        if max == f64::INFINITY && clean(x) == max {
            let n = logits.iter().filter(|&&v| clean(v) == max).count() as f64;
            return -n.ln() as f32;
        }
        return f32::NEG_INFINITY;
    }
    let lse = max + logits.iter().map(|&v| (clean(v) - max).exp()).sum::<f64>().ln();
    (clean(x) - lse) as f32
}

/// What [`StopStrings::check`] found in the text streamed so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCheck {
    /// A stop string begins at byte `cut_at`: the output is `text[..cut_at]` and generation ends.
    Stop { cut_at: usize },
    /// No stop string yet. The last `held_back_bytes` bytes could be the start of one, so only
    /// `text[..text.len() - held_back_bytes]` may be shown to the user now.
    Continue { held_back_bytes: usize },
}

/// Stop strings of a request, checked against the decoded text as it grows.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    max_len: usize,
}

impl StopStrings {
    /// Empty strings are dropped: they would stop every request before its first token.
    pub fn new<I, S>(stops: I) -> StopStrings
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops.into_iter().map(Into::into).filter(|s| !s.is_empty()).collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopStrings { stops, max_len }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Checks the whole `text` generated so far (cost: one substring search per stop string).
    pub fn check(&self, text: &str) -> StopCheck {
        if let Some(cut_at) = self.stops.iter().filter_map(|s| text.find(s.as_str())).min() {
            return StopCheck::Stop { cut_at };
        }
        StopCheck::Continue { held_back_bytes: self.held_back_bytes(text) }
    }

    /// The length of the longest suffix of `text` that is a proper prefix of a stop string. Such a suffix
    /// starts where a stop string starts, so it always begins on a character boundary.
    pub fn held_back_bytes(&self, text: &str) -> usize {
        let bytes = text.as_bytes();
        let longest = self.max_len.saturating_sub(1).min(bytes.len());
        (1..=longest)
            .rev()
            .find(|&n| {
                let tail = &bytes[bytes.len() - n..];
                self.stops.iter().any(|s| s.len() > n && s.as_bytes().starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerConfig {
        SamplerConfig { temperature, top_k, top_p, min_p, ..SamplerConfig::greedy() }
    }

    #[test]
    fn log_prob_of_agrees_with_the_top_k_figures() {
        let l = logits(500, 7);
        for (id, lp) in log_softmax_top_k(&l, 20) {
            assert_eq!(log_prob_of(&l, id), lp);
        }
        let total: f64 = (0..500).map(|i| (log_prob_of(&l, i) as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
        assert_eq!(log_prob_of(&l, 500), f32::NEG_INFINITY);
        assert_eq!(log_prob_of(&[f32::NAN, 0.0], 0), f32::NEG_INFINITY);
        assert_eq!(log_prob_of(&[f32::INFINITY, f32::INFINITY, 0.0], 1), -(2f32.ln()));
    }

    /// Deterministic pseudo-random logits (an LCG; the exact values do not matter).
    fn logits(n: usize, salt: u64) -> Vec<f32> {
        let mut x = salt.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 10.0 - 5.0
            })
            .collect()
    }

    fn argmax(l: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in l.iter().enumerate() {
            if x > l[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn greedy_picks_argmax_and_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        for salt in 0..20 {
            let l = logits(1000, salt);
            assert_eq!(s.sample(&l, &[], &[]), argmax(&l));
        }
        assert_eq!(s.sample(&[1.0, 3.0, 0.5, 3.0], &[], &[]), 1);
        // A negative temperature is greedy too.
        let mut s = Sampler::new(cfg(-1.0, 40, 0.9, 0.1));
        assert_eq!(s.sample(&[0.0, 2.0, 2.0], &[], &[]), 1);
    }

    /// Greedy without penalties or bans takes the one-pass argmax: the same id as the candidate list gives
    /// (reached here with a ban of an id past the vocabulary, which bans nothing), NaN, ties and -inf included.
    #[test]
    fn the_greedy_fast_path_picks_what_the_candidate_list_picks() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        let mut cases: Vec<Vec<f32>> = (0..20).map(|salt| logits(300, salt)).collect();
        cases.push(vec![f32::NAN, 1.0, 1.0, f32::NAN]);
        cases.push(vec![f32::NEG_INFINITY, f32::NEG_INFINITY]);
        cases.push(vec![-0.0, 0.0, f32::NAN]);
        cases.push(vec![2.0, f32::INFINITY, 3.0, f32::INFINITY]);
        for l in &cases {
            let fast = s.try_sample(l, &[], &[]);
            let listed = s.try_sample(l, &[], &[u32::MAX]);
            assert_eq!(fast, listed, "{l:?}");
        }
        assert_eq!(s.try_sample(&[f32::NAN, f32::NAN], &[], &[]), None);
    }

    #[test]
    fn top_k_one_equals_greedy_at_any_temperature() {
        for (i, temp) in [0.1f32, 0.8, 1.5, 10.0, 100.0].into_iter().enumerate() {
            let mut s = Sampler::new(SamplerConfig { seed: i as u64, ..cfg(temp, 1, 1.0, 0.0) });
            for salt in 0..20 {
                let l = logits(500, salt);
                assert_eq!(s.sample(&l, &[], &[]), argmax(&l), "temp {temp}");
            }
        }
    }

    #[test]
    fn tiny_temperature_is_greedy_not_nan() {
        // 1/T overflows f32; scaling relative to the best logit keeps the draw well defined.
        let mut s = Sampler::new(cfg(1e-30, 0, 1.0, 0.0));
        for salt in 0..20 {
            let l = logits(300, salt);
            assert_eq!(s.sample(&l, &[], &[]), argmax(&l));
        }
    }

    fn run(seed: u64, n: usize) -> Vec<u32> {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg(1.0, 0, 1.0, 0.0) });
        let l = vec![0.0f32; 64]; // uniform: every draw is pure randomness
        (0..n).map(|_| s.sample(&l, &[], &[])).collect()
    }

    #[test]
    fn same_seed_same_sequence_different_seed_differs() {
        assert_eq!(run(7, 200), run(7, 200));
        let (a, b) = (run(7, 200), run(8, 200));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // Independent uniform draws over 64 ids agree about 200/64 times.
        assert!(same < 20, "{same} of 200 draws agree across seeds");
        // And the draws really spread over the vocabulary.
        let mut seen = a.clone();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() > 40, "only {} distinct ids", seen.len());
    }

    /// llama.cpp b11312's `dist` over these logits with `std::mt19937(7)`, run as C++ (the draw loop of
    /// `llama_sampler_dist_apply`, g++ 12 / libstdc++): the ids it picks, in order.
    #[test]
    fn a_seed_draws_what_llama_cpp_draws_for_it() {
        let mut s = Sampler::new(SamplerConfig { seed: 7, ..cfg(1.0, 0, 1.0, 0.0) });
        let l = [0.0f32, 0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
        let got: Vec<u32> = (0..16).map(|_| s.sample(&l, &[], &[])).collect();
        assert_eq!(got, [0, 0, 3, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn draws_follow_the_softmax() {
        let mut s = Sampler::new(SamplerConfig { seed: 3, ..cfg(1.0, 0, 1.0, 0.0) });
        let l = [0.0f32, 2f32.ln(), f32::NEG_INFINITY]; // probabilities 1/3, 2/3, 0
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[s.sample(&l, &[], &[]) as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!((1800..2200).contains(&counts[1]), "{counts:?}");
    }

    #[test]
    fn banned_ids_are_never_chosen() {
        let banned: Vec<u32> = (0..50).collect();
        for c in [SamplerConfig::greedy(), cfg(2.0, 0, 1.0, 0.0), SamplerConfig::default()] {
            let mut s = Sampler::new(c);
            for salt in 0..200 {
                let mut l = logits(100, salt);
                l[3] = 100.0; // the banned favourite
                assert!(s.sample(&l, &[], &banned) >= 50);
            }
        }
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.try_sample(&[1.0, 2.0], &[], &[0, 1, 999]), None);
        assert_eq!(s.try_sample(&[], &[], &[]), None);
    }

    #[test]
    fn top_p_keeps_the_minimal_nucleus() {
        // Probabilities 0.5, 0.25, 0.125, 0.125.
        let l: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125].iter().map(|p| p.ln()).collect();
        let nucleus = |p: f32| {
            let mut c: Vec<Candidate> =
                l.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }).collect();
            top_k(&mut c, 0);
            top_p(&mut c, p);
            c.iter().map(|c| c.id).collect::<Vec<_>>()
        };
        assert_eq!(nucleus(0.5), [0]);
        assert_eq!(nucleus(0.6), [0, 1]);
        assert_eq!(nucleus(0.75), [0, 1]);
        assert_eq!(nucleus(0.8), [0, 1, 2]);
        assert_eq!(nucleus(0.01), [0]);
        // Through the sampler: with top_p 0.6 only ids 0 and 1 ever come out.
        let mut s = Sampler::new(cfg(1.0, 0, 0.6, 0.0));
        let ids: Vec<u32> = (0..500).map(|_| s.sample(&l, &[], &[])).collect();
        assert!(ids.iter().all(|&i| i < 2) && ids.contains(&1));
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // Probability ratios to the best: 1, 0.5, 0.05.
        let l = [0.0f32, 0.5f32.ln(), 0.05f32.ln()];
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.1));
        let ids: Vec<u32> = (0..500).map(|_| s.sample(&l, &[], &[])).collect();
        assert!(!ids.contains(&2) && ids.contains(&1));
    }

    #[test]
    fn top_k_limits_the_candidates() {
        let l = logits(1000, 5);
        let mut sorted: Vec<u32> = (0..1000).collect();
        sorted.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let mut s = Sampler::new(cfg(50.0, 3, 1.0, 0.0)); // a hot temperature spreads over all three
        let mut seen: Vec<u32> = (0..300).map(|_| s.sample(&l, &[], &[])).collect();
        seen.sort_unstable();
        seen.dedup();
        let mut top3 = sorted[..3].to_vec();
        top3.sort_unstable();
        assert_eq!(seen, top3);
    }

    #[test]
    fn repetition_penalty_changes_argmax() {
        let l = [3.0f32, 2.5, -1.0, -1.2];
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 1.5, ..SamplerConfig::greedy() });
        assert_eq!(s.sample(&l, &[], &[]), 0);
        assert_eq!(s.sample(&l, &[0], &[]), 1); // 3.0 / 1.5 = 2.0 < 2.5
                                                // Negative logits are multiplied, so a penalised -1.0 falls below -1.2.
        let l = [-1.0f32, -1.2];
        assert_eq!(s.sample(&l, &[0], &[]), 1);
        // Only the last `repeat_last_n` tokens count.
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 1.5, repeat_last_n: 2, ..SamplerConfig::greedy() });
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[0, 2, 2], &[]), 0);
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[2, 0], &[]), 1);
        // repeat_last_n = 0 turns the penalties off.
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 1.5, repeat_last_n: 0, ..SamplerConfig::greedy() });
        assert_eq!(s.sample(&[3.0, 2.5], &[0, 0], &[]), 0);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract() {
        let window = [0u32, 0, 0, 1];
        let pen = |presence: f32, frequency: f32| {
            let c =
                SamplerConfig { presence_penalty: presence, frequency_penalty: frequency, ..SamplerConfig::greedy() };
            let mut cands: Vec<Candidate> = (0..3).map(|i| Candidate { id: i, logit: 1.0 }).collect();
            apply_penalties(&mut cands, &window, &c);
            cands.iter().map(|c| c.logit).collect::<Vec<_>>()
        };
        assert_eq!(pen(0.5, 0.0), [0.5, 0.5, 1.0]);
        assert_eq!(pen(0.0, 0.25), [0.25, 0.75, 1.0]);
        assert_eq!(pen(0.5, 0.25), [-0.25, 0.25, 1.0]);
        // Through the sampler: token 0 (seen 3 times) loses to token 1 (seen once) under frequency.
        let mut s = Sampler::new(SamplerConfig { frequency_penalty: 0.5, ..SamplerConfig::greedy() });
        assert_eq!(s.sample(&[2.0, 1.2], &window, &[]), 1);
    }

    #[test]
    fn log_softmax_matches_the_definition() {
        let l = [1.0f32, 3.0, 2.0, f32::NAN, 3.0];
        let top = log_softmax_top_k(&l, 3);
        let z: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        let want = |x: f64| (x - z.ln()) as f32;
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4, 2]);
        for (&(_, lp), x) in top.iter().zip([3.0, 3.0, 2.0]) {
            assert!((lp - want(x)).abs() < 1e-6, "{lp} vs {}", want(x));
        }
        // All k: probabilities sum to one; k beyond the vocabulary returns the vocabulary.
        let l = logits(5000, 1);
        let all = log_softmax_top_k(&l, 10_000);
        assert_eq!(all.len(), 5000);
        let total: f64 = all.iter().map(|t| (t.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!(all.windows(2).all(|w| w[0].1 >= w[1].1));
        // Large logits do not overflow (max-subtracted).
        let big = log_softmax_top_k(&[1000.0, 1000.0], 1);
        assert_eq!(big[0].0, 0);
        assert!((big[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert!(log_softmax_top_k(&[], 3).is_empty());
        assert!(log_softmax_top_k(&[1.0], 0).is_empty());
    }

    #[test]
    fn stop_string_found_and_cut() {
        let st = StopStrings::new(["</s>", "\nUser:", ""]);
        assert_eq!(st.check("Hello</s>more"), StopCheck::Stop { cut_at: 5 });
        // The earliest stop wins, whichever string it is.
        assert_eq!(st.check("a\nUser: b</s>"), StopCheck::Stop { cut_at: 1 });
        assert_eq!(st.check("plain text"), StopCheck::Continue { held_back_bytes: 0 });
        assert!(StopStrings::new([""]).is_empty());
    }

    #[test]
    fn stop_string_across_chunk_boundaries() {
        let st = StopStrings::new(["</s>", "\nUser:"]);
        // Streamed chunk by chunk: the held-back tail is never shown, and the stop is found once complete.
        let chunks = ["Hi", " there<", "/", "s", ">tail"];
        let mut text = String::new();
        let mut shown = 0;
        let mut result = None;
        for c in chunks {
            text.push_str(c);
            match st.check(&text) {
                StopCheck::Stop { cut_at } => {
                    result = Some(cut_at);
                    break;
                }
                StopCheck::Continue { held_back_bytes } => {
                    let safe = text.len() - held_back_bytes;
                    assert!(safe >= shown, "shown text must only grow");
                    shown = safe;
                }
            }
        }
        assert_eq!(result, Some("Hi there".len()));
        assert_eq!(shown, "Hi there".len(), "the partial '</s' was never streamed");
        assert_eq!(st.held_back_bytes("abc\nUs"), 3);
        assert_eq!(st.held_back_bytes("abc<"), 1);
        assert_eq!(st.held_back_bytes("abc<x"), 0);
        // A false start is released once it cannot be a stop any more.
        assert_eq!(st.check("a</x"), StopCheck::Continue { held_back_bytes: 0 });
    }

    #[test]
    fn held_back_tail_starts_on_a_char_boundary() {
        let st = StopStrings::new(["éé!"]);
        let text = "café";
        let n = st.held_back_bytes(text);
        assert_eq!(n, "é".len());
        assert!(text.is_char_boundary(text.len() - n));
    }
}
