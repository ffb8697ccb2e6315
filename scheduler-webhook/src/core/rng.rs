//! The seeded pseudo-random source every tie break and every random choice
//! of the core draws from.
//!
//! SplitMix64, written out here so results never depend on a crate's
//! algorithm changes: a given seed gives the same placements forever.

/// SplitMix64 generator (Steele, Lea and Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (0 when `n` is 0), without modulo bias
    /// worth mentioning for the small `n` used here (Lemire's multiply-shift).
    pub fn below(&mut self, n: usize) -> usize {
        let wide = u128::from(self.next_u64()) * n as u128;
        usize::try_from(wide >> 64).unwrap_or(0)
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// Picks uniformly among equally scored candidates while scanning them once
/// (reservoir sampling of size one): the first candidate always wins, the
/// `k`-th tie replaces the current pick with probability `1/k`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TieBreak {
    ties: u64,
}

impl TieBreak {
    /// Starts a new group of equal candidates.
    pub fn reset(&mut self) {
        self.ties = 0;
    }

    /// Records one more equal candidate; true when it should replace the
    /// current pick.
    pub fn offer(&mut self, rng: &mut SplitMix64) -> bool {
        self.ties += 1;
        self.ties == 1 || rng.next_u64().is_multiple_of(self.ties)
    }

    /// How many equal candidates the current group has seen.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.ties
    }

    /// Adds another group's candidates to this one (after the caller chose
    /// between the two groups' picks in proportion to their counts).
    pub fn absorb(&mut self, other: Self) {
        self.ties += other.ties;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_sequence() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        // Reference value of SplitMix64 for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = SplitMix64::new(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = r.below(5);
            assert!(v < 5);
            seen[v] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn tie_break_is_roughly_uniform() {
        let mut r = SplitMix64::new(1);
        let mut wins = [0u32; 4];
        for _ in 0..4000 {
            let mut t = TieBreak::default();
            let mut pick = 0;
            for c in 0..4 {
                if t.offer(&mut r) {
                    pick = c;
                }
            }
            wins[pick] += 1;
        }
        assert!(wins.iter().all(|w| (800..1200).contains(w)), "{wins:?}");
    }
}
