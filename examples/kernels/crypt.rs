//! IDEA block cipher, as in the Java Grande Forum `Crypt` benchmark (section 2).
//!
//! 64-bit blocks (8 bytes, read as four little-endian 16-bit words), a 128-bit user key
//! expanded into 52 16-bit subkeys, 8 rounds plus an output transform, built from three
//! operations on 16-bit words: XOR, addition mod 2¹⁶ and multiplication mod 2¹⁶ + 1 (where
//! the word 0 stands for 2¹⁶). Decryption is the same cipher with the inverted key schedule.
//! Every block is independent (ECB), so any split of a buffer gives the same bytes.
//!
//! Two details follow the IDEA specification rather than the JGF code, which (1) multiplies
//! the raw words (`a·b mod 65537`, truncated to 16 bits: not invertible when the product is
//! ≡ 65536) and (2) rotates the key the other way (`>>> 9 | << 7`). Here multiplication is the
//! real IDEA one and the key schedule the standard 25-bit rotation, so [`self_test`] passes the
//! published test vector and decryption inverts encryption on every block.

/// The 52 subkeys of one direction.
pub(crate) type Subkeys = [u16; 52];

/// Multiplication modulo 65537, where the word 0 stands for 65536.
#[inline]
pub(crate) fn mul(a: u16, b: u16) -> u16 {
    if a == 0 {
        // 65536 · b ≡ −b (mod 65537).
        return 1u16.wrapping_sub(b);
    }
    if b == 0 {
        return 1u16.wrapping_sub(a);
    }
    let p = u32::from(a) * u32::from(b);
    let (lo, hi) = (p as u16, (p >> 16) as u16);
    // p = hi·65536 + lo ≡ lo − hi (mod 65537).
    lo.wrapping_sub(hi).wrapping_add(u16::from(lo < hi))
}

/// The multiplicative inverse modulo 65537 (0, standing for 65536 ≡ −1, is its own inverse).
pub(crate) fn inv(x: u16) -> u16 {
    // x^(p−2) mod p, by Fermat; 65537 is prime.
    let m: u64 = 65537;
    let mut base = if x == 0 { 65536 } else { u64::from(x) };
    let (mut e, mut r) = (65535u32, 1u64);
    while e > 0 {
        if e & 1 == 1 {
            r = r * base % m;
        }
        base = base * base % m;
        e >>= 1;
    }
    r as u16 // 65536 becomes 0
}

/// The encryption subkeys of a 128-bit user key (the key rotated left 25 bits per 8 words).
pub(crate) fn encrypt_key(user: [u16; 8]) -> Subkeys {
    let mut z = [0u16; 52];
    z[..8].copy_from_slice(&user);
    for i in 8..52 {
        z[i] = match i % 8 {
            0..=5 => (z[i - 7] << 9) | (z[i - 6] >> 7),
            6 => (z[i - 7] << 9) | (z[i - 14] >> 7),
            _ => (z[i - 15] << 9) | (z[i - 14] >> 7),
        };
    }
    z
}

/// The decryption subkeys from the encryption subkeys `z`.
pub(crate) fn decrypt_key(z: &Subkeys) -> Subkeys {
    let mut dk = [0u16; 52];
    let neg = |x: u16| x.wrapping_neg();
    dk[48] = inv(z[0]);
    dk[49] = neg(z[1]);
    dk[50] = neg(z[2]);
    dk[51] = inv(z[3]);
    let (mut j, mut k) = (47usize, 4usize);
    for round in 0..8 {
        // The two MA-layer keys, in the same order.
        dk[j - 1] = z[k];
        dk[j] = z[k + 1];
        // The four transform keys, inverted; the additive ones swap except at the ends.
        let (t1, t2, t3, t4) = (inv(z[k + 2]), neg(z[k + 3]), neg(z[k + 4]), inv(z[k + 5]));
        dk[j - 5] = t1;
        if round == 7 {
            dk[j - 4] = t2;
            dk[j - 3] = t3;
        } else {
            dk[j - 4] = t3;
            dk[j - 3] = t2;
        }
        dk[j - 2] = t4;
        k += 6;
        j = j.wrapping_sub(6);
    }
    dk
}

/// Encrypts (or, with decryption subkeys, decrypts) four words.
#[inline]
pub(crate) fn cipher_words(block: [u16; 4], key: &Subkeys) -> [u16; 4] {
    let [mut x1, mut x2, mut x3, mut x4] = block;
    for r in key[..48].chunks_exact(6) {
        x1 = mul(x1, r[0]);
        x2 = x2.wrapping_add(r[1]);
        x3 = x3.wrapping_add(r[2]);
        x4 = mul(x4, r[3]);
        let t2 = mul(x1 ^ x3, r[4]);
        let t1 = mul(t2.wrapping_add(x2 ^ x4), r[5]);
        let t2 = t1.wrapping_add(t2);
        x1 ^= t1;
        x4 ^= t2;
        let t2 = t2 ^ x2;
        x2 = x3 ^ t1;
        x3 = t2;
    }
    [
        mul(x1, key[48]),
        x3.wrapping_add(key[49]),
        x2.wrapping_add(key[50]),
        mul(x4, key[51]),
    ]
}

/// Ciphers one 8-byte block (four little-endian words, as JGF packs them).
#[inline]
pub(crate) fn cipher_block(input: &[u8; 8], key: &Subkeys) -> [u8; 8] {
    let w = |i: usize| u16::from_le_bytes([input[2 * i], input[2 * i + 1]]);
    let y = cipher_words([w(0), w(1), w(2), w(3)], key);
    let mut out = [0u8; 8];
    for (o, word) in out.chunks_exact_mut(2).zip(y) {
        o.copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Ciphers whole blocks from `input` into `output` (same length, a multiple of 8).
#[inline]
pub(crate) fn cipher_blocks(input: &[u8], output: &mut [u8], key: &Subkeys) {
    assert_eq!(input.len(), output.len(), "cipher_blocks: lengths differ");
    assert_eq!(input.len() % 8, 0, "cipher_blocks: not whole blocks");
    for (i, o) in input.chunks_exact(8).zip(output.chunks_exact_mut(8)) {
        let block: &[u8; 8] = i.try_into().expect("8 bytes");
        o.copy_from_slice(&cipher_block(block, key));
    }
}

/// Ciphers whole blocks from `input` (a multiple of 8 bytes long), appending them to `out`.
#[inline]
pub(crate) fn cipher_append(input: &[u8], out: &mut Vec<u8>, key: &Subkeys) {
    assert_eq!(input.len() % 8, 0, "cipher_append: not whole blocks");
    out.reserve(input.len());
    for i in input.chunks_exact(8) {
        out.extend_from_slice(&cipher_block(i.try_into().expect("8 bytes"), key));
    }
}

/// The sequential reference: a whole buffer ciphered block by block.
pub(crate) fn sequential(input: &[u8], key: &Subkeys) -> Vec<u8> {
    let mut out = vec![0u8; input.len()];
    cipher_blocks(input, &mut out, key);
    out
}

/// `len` deterministic pseudo-random bytes (the plaintext), from `seed`.
pub(crate) fn plaintext(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (i, c) in out.chunks_mut(8).enumerate() {
        let r = super::random_at(seed, i as u64).to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    out
}

/// A 128-bit user key from `seed`.
pub(crate) fn user_key(seed: u64) -> [u16; 8] {
    std::array::from_fn(|i| super::random_at(seed, i as u64) as u16)
}

/// The known-answer test of the IDEA specification (Lai & Massey): key 1..8, plaintext
/// 0, 1, 2, 3 → ciphertext 4603, 60715, 408, 28133. Panics if the cipher is wrong.
pub(crate) fn self_test() {
    let ek = encrypt_key([1, 2, 3, 4, 5, 6, 7, 8]);
    let c = cipher_words([0, 1, 2, 3], &ek);
    assert_eq!(
        c,
        [4603, 60715, 408, 28133],
        "IDEA known-answer test failed"
    );
    assert_eq!(
        cipher_words(c, &decrypt_key(&ek)),
        [0, 1, 2, 3],
        "IDEA decryption of the known answer failed"
    );
}
