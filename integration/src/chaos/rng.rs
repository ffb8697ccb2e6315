//! A small seeded generator (SplitMix64): the chaos soak's schedule of
//! submissions, deletions and faults depends only on the seed, on every
//! platform and compiler version.

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0; the modulo bias is below 2^-40 for the
    /// small `n` used here).
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
        usize::try_from(self.next_u64() % n).unwrap_or(0)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 random bits as a float in [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A duration between `lo` and `hi`, whole milliseconds.
    pub fn between(
        &mut self,
        lo: std::time::Duration,
        hi: std::time::Duration,
    ) -> std::time::Duration {
        let (lo, hi) = (lo.as_millis(), hi.as_millis().max(lo.as_millis()));
        let span = usize::try_from(hi - lo + 1).unwrap_or(usize::MAX);
        let ms = lo + u128::try_from(self.below(span)).unwrap_or(0);
        std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs[0], Rng::new(8).next_u64());
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn ranges_hold() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            let d = r.between(
                std::time::Duration::from_millis(5),
                std::time::Duration::from_millis(9),
            );
            assert!((5..=9).contains(&d.as_millis()));
        }
        let mut v = [1, 2, 3, 4, 5];
        r.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, [1, 2, 3, 4, 5]);
    }
}
