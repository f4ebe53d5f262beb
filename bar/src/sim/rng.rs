//! The simulator's own random numbers: SplitMix64 to derive seeds, xoshiro256** for streams, and the
//! uniform, normal, gamma (Marsaglia–Tsang) and beta samplers built on them. Written out here rather than
//! taken from a crate so a seed gives the same numbers whatever crate versions the build resolves.

/// One step of SplitMix64: a good 64-bit mixer, used to derive independent stream seeds.
pub fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for the stream identified by `keys` under `seed` (order matters).
pub fn stream_seed(seed: u64, keys: &[u64]) -> u64 {
    keys.iter().fold(splitmix64(seed), |state, &key| {
        splitmix64(state ^ splitmix64(key))
    })
}

/// xoshiro256** (Blackman and Vigna): fast, 256 bits of state, excellent statistical quality.
#[derive(Debug, Clone)]
pub struct Xoshiro256 {
    state: [u64; 4],
}

impl Xoshiro256 {
    /// A generator whose state is filled from `seed` by SplitMix64 (never all zero).
    pub fn new(seed: u64) -> Xoshiro256 {
        // The standard SplitMix64 sequence from `seed`.
        let mut state = [0_u64; 4];
        for (index, word) in (0_u64..).zip(&mut state) {
            *word = splitmix64(seed.wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        }
        if state == [0; 4] {
            state[0] = 1;
        }
        Xoshiro256 { state }
    }

    /// The generator for the stream `keys` under `seed`; see [`stream_seed`].
    pub fn for_stream(seed: u64, keys: &[u64]) -> Xoshiro256 {
        Xoshiro256::new(stream_seed(seed, keys))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.state[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let shifted = self.state[1] << 17;
        self.state[2] ^= self.state[0];
        self.state[3] ^= self.state[1];
        self.state[1] ^= self.state[2];
        self.state[0] ^= self.state[3];
        self.state[2] ^= shifted;
        self.state[3] = self.state[3].rotate_left(45);
        result
    }

    /// Uniform on [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1_u64 << 53) as f64)
    }

    /// Standard normal by Box–Muller (always two uniforms, so stream use is fixed).
    pub fn normal(&mut self) -> f64 {
        let radius = (-2.0 * (1.0 - self.uniform()).ln()).sqrt();
        let angle = std::f64::consts::TAU * self.uniform();
        radius * angle.cos()
    }

    /// Gamma(shape, 1) by Marsaglia and Tsang (2000); shapes below 1 use the boost
    /// `Gamma(a) = Gamma(a + 1) U^(1/a)`. A non-positive or non-finite shape returns 0.
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if !(shape > 0.0 && shape.is_finite()) {
            return 0.0;
        }
        if shape < 1.0 {
            let boost = self.uniform().powf(1.0 / shape);
            return self.gamma(shape + 1.0) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform();
            if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
                return d * v;
            }
        }
    }

    /// Beta(a, b) as `X / (X + Y)` with independent `X ~ Gamma(a)`, `Y ~ Gamma(b)`.
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y > 0.0 { x / (x + y) } else { 0.5 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and variance of `samples` draws.
    fn moments(samples: usize, mut sample: impl FnMut() -> f64) -> (f64, f64) {
        let values: Vec<f64> = (0..samples).map(|_| sample()).collect();
        let mean = values.iter().sum::<f64>() / samples as f64;
        let variance =
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (samples as f64 - 1.0);
        (mean, variance)
    }

    /// Asserts a sample mean is within 5 standard errors of `expected` given the true variance.
    fn assert_mean(name: &str, samples: usize, mean: f64, expected: f64, true_variance: f64) {
        let error = 5.0 * (true_variance / samples as f64).sqrt();
        assert!(
            (mean - expected).abs() < error,
            "{name}: mean {mean}, expected {expected} +- {error}"
        );
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let mut a = Xoshiro256::for_stream(7, &[1, 2]);
        let mut b = Xoshiro256::for_stream(7, &[1, 2]);
        let mut c = Xoshiro256::for_stream(7, &[2, 1]);
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..4).map(|_| c.next_u64()).collect::<Vec<_>>());
        // Known SplitMix64 output for state 0 (from the reference implementation).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn samplers_have_the_right_moments() {
        const SAMPLES: usize = 40_000;
        let mut rng = Xoshiro256::new(11);
        let (mean, variance) = moments(SAMPLES, || rng.uniform());
        assert_mean("uniform", SAMPLES, mean, 0.5, 1.0 / 12.0);
        assert!((variance - 1.0 / 12.0).abs() < 0.003);
        let (mean, variance) = moments(SAMPLES, || rng.normal());
        assert_mean("normal", SAMPLES, mean, 0.0, 1.0);
        assert!((variance - 1.0).abs() < 0.04);
        for shape in [0.5, 1.0, 2.0, 7.5] {
            // Gamma(k): mean k, variance k.
            let (mean, variance) = moments(SAMPLES, || rng.gamma(shape));
            assert_mean("gamma", SAMPLES, mean, shape, shape);
            assert!(
                (variance / shape - 1.0).abs() < 0.1,
                "gamma({shape}) variance {variance}"
            );
        }
        // Beta(0.5, 2): mean a/(a+b) = 0.2, variance ab/((a+b)^2 (a+b+1)) = 1/(6.25 x 3.5).
        let beta_variance = 1.0 / (6.25 * 3.5);
        let (mean, variance) = moments(SAMPLES, || rng.beta(0.5, 2.0));
        assert_mean("beta", SAMPLES, mean, 0.2, beta_variance);
        assert!(
            (variance / beta_variance - 1.0).abs() < 0.05,
            "beta variance {variance}"
        );
        assert_eq!(rng.gamma(0.0), 0.0);
        assert_eq!(rng.gamma(f64::NAN), 0.0);
    }
}
