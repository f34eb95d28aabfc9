//! A fixed pseudo-random sequence, so that every variant of a run meets
//! the same events.

/// Whether the `n`-th event falls in a `share` of all: a fixed
/// pseudo-random sequence (splitmix64), so every variant of a run meets the
/// same events.
pub fn pseudo_random_share(n: u64, share: f64) -> bool {
    let mut z = n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < share
}
