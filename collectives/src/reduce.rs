//! Reduction kernels over byte buffers: the only computation a collective does.
//!
//! Buffers here are `&[u8]` in native byte order with no alignment requirement: a slot of the
//! shared-memory ring, a user buffer at any offset, an RDMA receive buffer. Each kernel walks the
//! bytes in fixed-size element chunks (`chunks_exact` + `from_ne_bytes`), which LLVM turns into
//! unaligned vector loads and stores: the `f32` sum compiles to packed `addps` over 16-byte
//! vectors on baseline x86-64 (see `benches/reduce.rs`, which prints the kernel's bandwidth beside
//! `memcpy`). `f16` and `bf16` are widened to `f32` with branch-free bit conversions (which
//! vectorize as well), combined, and rounded back to nearest even.
//!
//! # Operand order and reproducibility
//! Every kernel computes `f(x, y)` with `x` the partial result that arrived from a peer and `y` the
//! local contribution, always in that order. The algorithms fix which rank adds which element
//! when (see [`crate::algorithms`]), so a given `(nranks, count, slot size)` reduces every element in
//! the same order on every run: results are bit-reproducible, and in-place and out-of-place calls
//! give identical bits.
//!
//! # Half-precision accumulation
//! As in NCCL, `f16` and `bf16` partial sums are rounded to the element type after every step (the
//! `f32` widening is exact, and a binary32 add of two binary16 or bfloat16 values followed by
//! rounding equals the correctly rounded half-precision add, since 24 >= 2p + 2 makes the double
//! rounding innocuous). A sum over `n` ranks therefore carries at most `n - 1` roundings: its error
//! is bounded by `(n - 1) * u * sum(|x_i|)` with unit roundoff `u = 2^-11` for `f16` and `2^-8`
//! for `bf16`; the tests check exactly this bound against an `f64` reference.

use core::fmt;

use crate::datatype::{DataType, RedOp};

/// Buffers of a kernel call that do not describe the same number of whole elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelError {
    /// The operands differ in length (bytes).
    LengthMismatch {
        /// Destination length, in bytes.
        dst: usize,
        /// Length of the operand that differs, in bytes.
        src: usize,
    },
    /// A length that is not a whole number of elements.
    PartialElement {
        /// Length, in bytes.
        len: usize,
        /// The element type.
        datatype: DataType,
    },
    /// `avg` asked to divide by zero ranks.
    ZeroDivisor,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KernelError::LengthMismatch { dst, src } => write!(
                f,
                "reduction operands differ in length: destination {dst} bytes, source {src} bytes"
            ),
            KernelError::PartialElement { len, datatype } => write!(
                f,
                "{len} bytes is not a whole number of {datatype} elements ({} bytes each)",
                datatype.size()
            ),
            KernelError::ZeroDivisor => f.write_str("avg over zero ranks"),
        }
    }
}

impl std::error::Error for KernelError {}

/// One element type as the kernels see it: a native-endian load and store plus the operators.
trait Lane: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn sum(x: Self, y: Self) -> Self;
    fn prod(x: Self, y: Self) -> Self;
    fn min(x: Self, y: Self) -> Self;
    fn max(x: Self, y: Self) -> Self;
    /// `self / n`, the `avg` post-division (integers truncate toward zero).
    fn div(self, n: u32) -> Self;
}

macro_rules! lane_int {
    ($($t:ty => $wide:ty),*) => {$(
        impl Lane for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(x: Self, y: Self) -> Self { x.wrapping_add(y) }
            #[inline(always)]
            fn prod(x: Self, y: Self) -> Self { x.wrapping_mul(y) }
            #[inline(always)]
            fn min(x: Self, y: Self) -> Self { Ord::min(x, y) }
            #[inline(always)]
            fn max(x: Self, y: Self) -> Self { Ord::max(x, y) }
            #[inline(always)]
            fn div(self, n: u32) -> Self {
                // Widened so that any rank count is representable; |x / n| <= |x| fits back.
                // `wrapping_div` only wraps for MIN / -1, which cannot occur with n >= 1.
                (<$wide>::from(self).wrapping_div(<$wide>::from(n))) as $t
            }
        }
    )*};
}

lane_int!(i8 => i64, u8 => u64, i32 => i64, u32 => u64, i64 => i64, u64 => u64);

macro_rules! lane_float {
    ($($t:ty),*) => {$(
        impl Lane for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(x: Self, y: Self) -> Self { x + y }
            #[inline(always)]
            fn prod(x: Self, y: Self) -> Self { x * y }
            #[inline(always)]
            fn min(x: Self, y: Self) -> Self { x.min(y) }
            #[inline(always)]
            fn max(x: Self, y: Self) -> Self { x.max(y) }
            #[inline(always)]
            fn div(self, n: u32) -> Self { self / (n as $t) }
        }
    )*};
}

lane_float!(f32, f64);

/// `dst[i] = f(x[i], y[i])` over whole elements of `T`.
#[inline(always)]
fn map2<T: Lane>(dst: &mut [u8], x: &[u8], y: &[u8], f: impl Fn(T, T) -> T) {
    for ((d, a), b) in dst
        .chunks_exact_mut(T::SIZE)
        .zip(x.chunks_exact(T::SIZE))
        .zip(y.chunks_exact(T::SIZE))
    {
        f(T::load(a), T::load(b)).store(d);
    }
}

/// `acc[i] = f(x[i], acc[i])` over whole elements of `T`.
#[inline(always)]
fn map2_acc<T: Lane>(acc: &mut [u8], x: &[u8], f: impl Fn(T, T) -> T) {
    for (d, a) in acc.chunks_exact_mut(T::SIZE).zip(x.chunks_exact(T::SIZE)) {
        f(T::load(a), T::load(d)).store(d);
    }
}

fn typed_copy<T: Lane>(op: RedOp, dst: &mut [u8], x: &[u8], y: &[u8]) {
    match op.step_op() {
        RedOp::Sum | RedOp::Avg => map2::<T>(dst, x, y, T::sum),
        RedOp::Prod => map2::<T>(dst, x, y, T::prod),
        RedOp::Min => map2::<T>(dst, x, y, T::min),
        RedOp::Max => map2::<T>(dst, x, y, T::max),
    }
}

fn typed_acc<T: Lane>(op: RedOp, acc: &mut [u8], x: &[u8]) {
    match op.step_op() {
        RedOp::Sum | RedOp::Avg => map2_acc::<T>(acc, x, T::sum),
        RedOp::Prod => map2_acc::<T>(acc, x, T::prod),
        RedOp::Min => map2_acc::<T>(acc, x, T::min),
        RedOp::Max => map2_acc::<T>(acc, x, T::max),
    }
}

fn typed_div<T: Lane>(buf: &mut [u8], n: u32) {
    for d in buf.chunks_exact_mut(T::SIZE) {
        T::load(d).div(n).store(d);
    }
}

/// binary16 bits -> binary32, exactly (branch-free, so LLVM vectorizes the loops that call it;
/// the subnormal path is F. Giesen's magic-number renormalisation).
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    const SHIFTED_EXP: u32 = 0x7c00 << 13;
    let magic = f32::from_bits(113 << 23);
    let mut o = u32::from(h & 0x7fff) << 13;
    let exp = SHIFTED_EXP & o;
    o += (127 - 15) << 23;
    let inf_nan = o + ((128 - 16) << 23);
    let subnormal = (f32::from_bits(o + (1 << 23)) - magic).to_bits();
    let o = if exp == SHIFTED_EXP {
        inf_nan
    } else if exp == 0 {
        subnormal
    } else {
        o
    };
    f32::from_bits(o | (u32::from(h & 0x8000) << 16))
}

/// binary32 -> binary16 bits, rounding to nearest even (F. Giesen's `float_to_half_fast3_rtne`):
/// overflow gives infinity, NaN a quiet NaN, tiny values subnormals or zero.
#[inline(always)]
fn f32_to_f16_bits(f: f32) -> u16 {
    const F32_INF: u32 = 255 << 23;
    const F16_MAX: u32 = (127 + 16) << 23;
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    let a = bits ^ sign;
    let big = if a > F32_INF { 0x7e00 } else { 0x7c00 };
    let small = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC))
        .to_bits()
        .wrapping_sub(DENORM_MAGIC);
    let mant_odd = (a >> 13) & 1;
    let normal = (a
        .wrapping_add(((15u32).wrapping_sub(127) << 23).wrapping_add(0xfff))
        .wrapping_add(mant_odd))
        >> 13;
    let o = if a >= F16_MAX {
        big
    } else if a < (113 << 23) {
        small
    } else {
        normal
    };
    (o | (sign >> 16)) as u16
}

/// bfloat16 bits -> binary32, exactly.
#[inline(always)]
fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// binary32 -> bfloat16 bits, rounding to nearest even; NaN stays a (quiet) NaN.
#[inline(always)]
fn f32_to_bf16_bits(f: f32) -> u16 {
    let b = f.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if f.is_nan() { nan } else { rounded }) as u16
}

macro_rules! lane_half {
    ($($name:ident, $to_f32:ident, $from_f32:ident, $doc:literal);*) => {$(
        #[doc = $doc]
        #[derive(Clone, Copy)]
        struct $name(u16);

        impl $name {
            #[inline(always)]
            fn via_f32(x: Self, y: Self, f: impl Fn(f32, f32) -> f32) -> Self {
                $name($from_f32(f($to_f32(x.0), $to_f32(y.0))))
            }
        }

        impl Lane for $name {
            const SIZE: usize = 2;
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                // Through an array, not `[b[0], b[1]]`: LLVM then loads whole vectors instead of
                // gathering bytes.
                let mut a = [0u8; 2];
                a.copy_from_slice(b);
                $name(u16::from_ne_bytes(a))
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.0.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(x: Self, y: Self) -> Self { Self::via_f32(x, y, |a, b| a + b) }
            #[inline(always)]
            fn prod(x: Self, y: Self) -> Self { Self::via_f32(x, y, |a, b| a * b) }
            #[inline(always)]
            fn min(x: Self, y: Self) -> Self { Self::via_f32(x, y, f32::min) }
            #[inline(always)]
            fn max(x: Self, y: Self) -> Self { Self::via_f32(x, y, f32::max) }
            #[inline(always)]
            fn div(self, n: u32) -> Self { $name($from_f32($to_f32(self.0) / n as f32)) }
        }
    )*};
}

lane_half!(
    F16Lane, f16_bits_to_f32, f32_to_f16_bits, "An `f16` as the kernels see it: computed in `f32`, rounded back after every operation.";
    Bf16Lane, bf16_bits_to_f32, f32_to_bf16_bits, "A `bf16` as the kernels see it: computed in `f32`, rounded back after every operation."
);

fn check_len(datatype: DataType, dst: usize, src: usize) -> Result<(), KernelError> {
    if dst != src {
        return Err(KernelError::LengthMismatch { dst, src });
    }
    if dst % datatype.size() != 0 {
        return Err(KernelError::PartialElement { len: dst, datatype });
    }
    Ok(())
}

/// `dst[i] = op(x[i], y[i])` element-wise: NCCL's `reduceCopy` with two sources.
///
/// `x` is the partial result received from a peer, `y` the local contribution; `avg` reduces with
/// `sum` (divide afterwards with [`divide_in_place`]). All three buffers are native-endian
/// elements of `datatype` at any alignment.
///
/// # Errors
/// [`KernelError::LengthMismatch`] when the lengths differ, [`KernelError::PartialElement`] when
/// they are not a whole number of elements. Nothing is written then.
pub fn reduce_copy(
    datatype: DataType,
    op: RedOp,
    dst: &mut [u8],
    x: &[u8],
    y: &[u8],
) -> Result<(), KernelError> {
    check_len(datatype, dst.len(), x.len())?;
    check_len(datatype, dst.len(), y.len())?;
    match datatype {
        DataType::I8 => typed_copy::<i8>(op, dst, x, y),
        DataType::U8 => typed_copy::<u8>(op, dst, x, y),
        DataType::I32 => typed_copy::<i32>(op, dst, x, y),
        DataType::U32 => typed_copy::<u32>(op, dst, x, y),
        DataType::I64 => typed_copy::<i64>(op, dst, x, y),
        DataType::U64 => typed_copy::<u64>(op, dst, x, y),
        DataType::F32 => typed_copy::<f32>(op, dst, x, y),
        DataType::F64 => typed_copy::<f64>(op, dst, x, y),
        DataType::F16 => typed_copy::<F16Lane>(op, dst, x, y),
        DataType::Bf16 => typed_copy::<Bf16Lane>(op, dst, x, y),
    }
    Ok(())
}

/// `acc[i] = op(x[i], acc[i])` element-wise: the in-place form of [`reduce_copy`] with the
/// local contribution already in `acc` (same operand order, so the same bits).
///
/// # Errors
/// As [`reduce_copy`].
pub fn reduce_in_place(
    datatype: DataType,
    op: RedOp,
    acc: &mut [u8],
    x: &[u8],
) -> Result<(), KernelError> {
    check_len(datatype, acc.len(), x.len())?;
    match datatype {
        DataType::I8 => typed_acc::<i8>(op, acc, x),
        DataType::U8 => typed_acc::<u8>(op, acc, x),
        DataType::I32 => typed_acc::<i32>(op, acc, x),
        DataType::U32 => typed_acc::<u32>(op, acc, x),
        DataType::I64 => typed_acc::<i64>(op, acc, x),
        DataType::U64 => typed_acc::<u64>(op, acc, x),
        DataType::F32 => typed_acc::<f32>(op, acc, x),
        DataType::F64 => typed_acc::<f64>(op, acc, x),
        DataType::F16 => typed_acc::<F16Lane>(op, acc, x),
        DataType::Bf16 => typed_acc::<Bf16Lane>(op, acc, x),
    }
    Ok(())
}

/// `buf[i] = buf[i] / nranks`: the `avg` post-division applied once to a finished sum.
///
/// Integers divide with truncation toward zero; floating-point types divide in their own
/// precision (`f16`/`bf16` through `f32`, rounded once).
///
/// # Errors
/// [`KernelError::PartialElement`], or [`KernelError::ZeroDivisor`] for `nranks == 0`.
pub fn divide_in_place(datatype: DataType, buf: &mut [u8], nranks: u32) -> Result<(), KernelError> {
    check_len(datatype, buf.len(), buf.len())?;
    if nranks == 0 {
        return Err(KernelError::ZeroDivisor);
    }
    if nranks == 1 {
        return Ok(());
    }
    match datatype {
        DataType::I8 => typed_div::<i8>(buf, nranks),
        DataType::U8 => typed_div::<u8>(buf, nranks),
        DataType::I32 => typed_div::<i32>(buf, nranks),
        DataType::U32 => typed_div::<u32>(buf, nranks),
        DataType::I64 => typed_div::<i64>(buf, nranks),
        DataType::U64 => typed_div::<u64>(buf, nranks),
        DataType::F32 => typed_div::<f32>(buf, nranks),
        DataType::F64 => typed_div::<f64>(buf, nranks),
        DataType::F16 => typed_div::<F16Lane>(buf, nranks),
        DataType::Bf16 => typed_div::<Bf16Lane>(buf, nranks),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn half_conversions_match_the_half_crate() {
        for h in 0..=u16::MAX {
            let (mine, theirs) = (f16_bits_to_f32(h), f16::from_bits(h).to_f32());
            assert!(
                mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                "f16 {h:#06x}"
            );
            let (mine, theirs) = (bf16_bits_to_f32(h), bf16::from_bits(h).to_f32());
            assert!(
                mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                "bf16 {h:#06x}"
            );
        }
        // Every f16 value, the midpoints between neighbours (ties to even) and a sweep of f32.
        let mut samples: Vec<u32> = (0..=u32::MAX).step_by(4093).collect();
        for h in 0..0x7c00u32 {
            let lo = f16::from_bits(h as u16).to_f32();
            let hi = f16::from_bits(h as u16 + 1).to_f32();
            for v in [lo, (lo + hi) / 2.0, f32::from_bits(lo.to_bits() + 1)] {
                samples.push(v.to_bits());
                samples.push(v.to_bits() | 0x8000_0000);
            }
        }
        for b in samples {
            let f = f32::from_bits(b);
            let (mine, theirs) = (f32_to_f16_bits(f), f16::from_f32(f).to_bits());
            assert!(
                mine == theirs || (f.is_nan() && f16::from_bits(mine).is_nan()),
                "f32 {f:e} ({b:#x}) -> f16 {mine:#06x}, want {theirs:#06x}"
            );
            let (mine, theirs) = (f32_to_bf16_bits(f), bf16::from_f32(f).to_bits());
            assert!(
                mine == theirs || (f.is_nan() && bf16::from_bits(mine).is_nan()),
                "f32 {f:e} -> bf16 {mine:#06x}, want {theirs:#06x}"
            );
        }
    }

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn f32_sum_at_odd_offsets() {
        let x = bytes_f32(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        let y = bytes_f32(&[10.0, 20.0, 30.0, 40.0, 50.0]);
        // Shift every operand to an odd address: the kernels must not care.
        let mut xb = [0u8; 21];
        let mut yb = [0u8; 22];
        let mut db = [0u8; 23];
        xb[1..].copy_from_slice(&x);
        yb[2..].copy_from_slice(&y);
        reduce_copy(DataType::F32, RedOp::Sum, &mut db[3..], &xb[1..], &yb[2..]).unwrap();
        assert_eq!(&db[3..], &bytes_f32(&[11.0, 22.0, 33.0, 44.0, 55.0])[..]);
    }

    #[test]
    fn length_errors() {
        let mut d = [0u8; 8];
        assert_eq!(
            reduce_copy(DataType::F32, RedOp::Sum, &mut d, &[0; 4], &[0; 8]),
            Err(KernelError::LengthMismatch { dst: 8, src: 4 })
        );
        assert_eq!(
            reduce_in_place(DataType::F64, RedOp::Sum, &mut d[..6], &[0; 6]),
            Err(KernelError::PartialElement {
                len: 6,
                datatype: DataType::F64
            })
        );
        assert_eq!(
            divide_in_place(DataType::U8, &mut d, 0),
            Err(KernelError::ZeroDivisor)
        );
    }

    #[test]
    fn integer_avg_truncates_toward_zero_and_sum_wraps() {
        let mut b = (-7i32).to_ne_bytes().to_vec();
        divide_in_place(DataType::I32, &mut b, 2).unwrap();
        assert_eq!(i32::from_ne_bytes(b[..4].try_into().unwrap()), -3);
        let mut d = [0u8; 1];
        reduce_copy(DataType::U8, RedOp::Sum, &mut d, &[200], &[100]).unwrap();
        assert_eq!(d[0], 44);
        let mut d = [0u8; 1];
        reduce_copy(DataType::I8, RedOp::Avg, &mut d, &[100], &[100]).unwrap();
        assert_eq!(d[0] as i8, -56, "avg reduces with a wrapping sum");
        let mut big = [0x80u8];
        divide_in_place(DataType::I8, &mut big, 200).unwrap();
        assert_eq!(
            big[0], 0,
            "-128 / 200 truncates to 0 even though 200 does not fit an i8"
        );
    }

    #[test]
    fn half_blocks_cover_ragged_tails() {
        // 600 elements: two full blocks and a partial one.
        let n = 600;
        let x: Vec<u8> = (0..n)
            .flat_map(|i| f16::from_f32(i as f32).to_bits().to_ne_bytes())
            .collect();
        let y: Vec<u8> = (0..n)
            .flat_map(|_| f16::from_f32(0.5).to_bits().to_ne_bytes())
            .collect();
        let mut d = vec![0u8; 2 * n];
        reduce_copy(DataType::F16, RedOp::Sum, &mut d, &x, &y).unwrap();
        for i in 0..n {
            let got = f16::from_bits(u16::from_ne_bytes([d[2 * i], d[2 * i + 1]]));
            assert_eq!(
                got,
                f16::from_f32(i as f32) + f16::from_f32(0.5),
                "element {i}"
            );
        }
    }
}
