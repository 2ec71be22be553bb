//! The reduction kernels against a scalar reference, for every data type and operator, on
//! buffers at arbitrary byte offsets (alignment must not matter), and the half-precision
//! accumulation bound documented in `collectives::reduce`.

use collectives::reduce::{divide_in_place, reduce_copy, reduce_in_place};
use collectives::{DataType, RedOp};
use half::{bf16, f16};
use proptest::prelude::*;

/// Scalar reference arithmetic of one type, written independently of the kernels.
trait Reference: Copy + core::fmt::Debug + 'static {
    const DATATYPE: DataType;
    fn to_bytes(self) -> Vec<u8>;
    fn from_bytes(b: &[u8]) -> Self;
    fn op(op: RedOp, x: Self, y: Self) -> Self;
    fn div(self, n: u32) -> Self;
    /// Bit-exact comparison (NaNs compare by bits too).
    fn same(self, other: Self) -> bool;
}

macro_rules! int_reference {
    ($($t:ty => $d:ident),*) => {$(
        impl Reference for $t {
            const DATATYPE: DataType = DataType::$d;
            fn to_bytes(self) -> Vec<u8> { self.to_ne_bytes().to_vec() }
            fn from_bytes(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            fn op(op: RedOp, x: Self, y: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => x.wrapping_add(y),
                    RedOp::Prod => x.wrapping_mul(y),
                    RedOp::Min => if x < y { x } else { y },
                    RedOp::Max => if x > y { x } else { y },
                }
            }
            fn div(self, n: u32) -> Self { (self as i128 / n as i128) as $t }
            fn same(self, other: Self) -> bool { self == other }
        }
    )*};
}

int_reference!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

macro_rules! float_reference {
    ($($t:ty => $d:ident, $bits:ty),*) => {$(
        impl Reference for $t {
            const DATATYPE: DataType = DataType::$d;
            fn to_bytes(self) -> Vec<u8> { self.to_ne_bytes().to_vec() }
            fn from_bytes(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            fn op(op: RedOp, x: Self, y: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => x + y,
                    RedOp::Prod => x * y,
                    // IEEE minNum / maxNum: a NaN operand yields the other.
                    RedOp::Min => if x.is_nan() { y } else if y.is_nan() { x } else if x < y { x } else if y < x { y } else { x.min(y) },
                    RedOp::Max => if x.is_nan() { y } else if y.is_nan() { x } else if x > y { x } else if y > x { y } else { x.max(y) },
                }
            }
            fn div(self, n: u32) -> Self { self / n as $t }
            fn same(self, other: Self) -> bool {
                self.to_bits() == other.to_bits() || (self.is_nan() && other.is_nan())
            }
        }
    )*};
}

float_reference!(f32 => F32, u32, f64 => F64, u64);

macro_rules! half_reference {
    ($($t:ty => $d:ident),*) => {$(
        impl Reference for $t {
            const DATATYPE: DataType = DataType::$d;
            fn to_bytes(self) -> Vec<u8> { self.to_bits().to_ne_bytes().to_vec() }
            fn from_bytes(b: &[u8]) -> Self { <$t>::from_bits(u16::from_ne_bytes([b[0], b[1]])) }
            fn op(op: RedOp, x: Self, y: Self) -> Self {
                // Computed in f64 and rounded once: for + and * of two half-precision values the
                // f64 result is exact, so this is the correctly rounded operation.
                let (a, b) = (x.to_f64(), y.to_f64());
                let r = match op {
                    RedOp::Sum | RedOp::Avg => a + b,
                    RedOp::Prod => a * b,
                    RedOp::Min => f64::min(a, b),
                    RedOp::Max => f64::max(a, b),
                };
                <$t>::from_f64(r)
            }
            fn div(self, n: u32) -> Self { <$t>::from_f64(self.to_f64() / n as f64) }
            fn same(self, other: Self) -> bool {
                self.to_bits() == other.to_bits() || (self.is_nan() && other.is_nan())
            }
        }
    )*};
}

half_reference!(f16 => F16, bf16 => Bf16);

fn bytes<T: Reference>(v: &[T], offset: usize) -> Vec<u8> {
    let mut b = vec![0xa5u8; offset];
    for x in v {
        b.extend(x.to_bytes());
    }
    b
}

fn values<T: Reference>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::DATATYPE.size())
        .map(T::from_bytes)
        .collect()
}

/// Checks reduce_copy, reduce_in_place and divide_in_place against the reference for one type.
fn check<T: Reference>(x: &[T], y: &[T], op: RedOp, offsets: (usize, usize, usize), n: u32) {
    let len = x.len().min(y.len());
    let (x, y) = (&x[..len], &y[..len]);
    let size = len * T::DATATYPE.size();
    let xb = bytes(x, offsets.0);
    let yb = bytes(y, offsets.1);
    let mut db = vec![0u8; offsets.2 + size];
    reduce_copy(
        T::DATATYPE,
        op,
        &mut db[offsets.2..],
        &xb[offsets.0..],
        &yb[offsets.1..],
    )
    .unwrap();
    let got: Vec<T> = values(&db[offsets.2..]);
    for i in 0..len {
        let want = T::op(op, x[i], y[i]);
        assert!(
            got[i].same(want),
            "{:?} {op}: f({:?}, {:?}) = {:?}, want {:?}",
            T::DATATYPE,
            x[i],
            y[i],
            got[i],
            want
        );
    }
    // In place, same operand order: same bits.
    let mut acc = yb.clone();
    reduce_in_place(T::DATATYPE, op, &mut acc[offsets.1..], &xb[offsets.0..]).unwrap();
    assert_eq!(
        &acc[offsets.1..],
        &db[offsets.2..],
        "{:?} {op}: in place differs",
        T::DATATYPE
    );
    // avg's post-division.
    divide_in_place(T::DATATYPE, &mut db[offsets.2..], n).unwrap();
    let got: Vec<T> = values(&db[offsets.2..]);
    for i in 0..len {
        let want = T::op(op, x[i], y[i]).div(n);
        assert!(
            got[i].same(want),
            "{:?}: {:?} / {n} = {:?}, want {:?}",
            T::DATATYPE,
            T::op(op, x[i], y[i]),
            got[i],
            want
        );
    }
}

fn any_op() -> impl Strategy<Value = RedOp> {
    prop::sample::select(RedOp::ALL.to_vec())
}

fn offsets() -> impl Strategy<Value = (usize, usize, usize)> {
    (0usize..8, 0usize..8, 0usize..8)
}

/// One property per data type, named `$name`: [`check`] on two vectors of `$elem` values (the
/// length of each in `$len`), any operator, byte offsets and an `avg` divisor.
macro_rules! kernel_props {
    ($($name:ident: $elem:expr, $len:expr;)*) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            $(
                #[test]
                fn $name(
                    x in prop::collection::vec($elem, $len),
                    y in prop::collection::vec($elem, $len),
                    op in any_op(),
                    o in offsets(),
                    n in 1u32..300,
                ) {
                    check(&x, &y, op, o, n);
                }
            )*
        }
    };
}

// Half-precision values come from their bits: every finite value, infinities and NaNs included.
kernel_props! {
    i8_kernels: any::<i8>(), 0..300;
    u8_kernels: any::<u8>(), 0..300;
    i32_kernels: any::<i32>(), 0..300;
    u32_kernels: any::<u32>(), 0..300;
    i64_kernels: any::<i64>(), 0..300;
    u64_kernels: any::<u64>(), 0..300;
    f32_kernels: any::<f32>(), 0..300;
    f64_kernels: any::<f64>(), 0..300;
    f16_kernels: any::<u16>().prop_map(f16::from_bits), 0..700;
    bf16_kernels: any::<u16>().prop_map(bf16::from_bits), 0..700;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A sum over `k` ranks accumulated in the type itself (one rounding per step, as the ring
    /// does) stays within `(k - 1) * u * sum(|x_i|)` of the exact sum, with u = 2^-11 (f16) and
    /// 2^-8 (bf16).
    #[test]
    fn half_precision_sums_stay_within_the_documented_bound(
        ranks in prop::collection::vec(prop::collection::vec(-1000.0f32..1000.0, 64), 2..9)
    ) {
        for (datatype, u) in [(DataType::F16, 2f64.powi(-11)), (DataType::Bf16, 2f64.powi(-8))] {
            let enc = |v: &[f32]| -> Vec<u8> {
                v.iter().flat_map(|&x| match datatype {
                    DataType::F16 => f16::from_f32(x).to_bits().to_ne_bytes(),
                    _ => bf16::from_f32(x).to_bits().to_ne_bytes(),
                }).collect()
            };
            let dec = |b: &[u8]| -> Vec<f64> {
                b.chunks_exact(2).map(|c| {
                    let bits = u16::from_ne_bytes([c[0], c[1]]);
                    match datatype {
                        DataType::F16 => f16::from_bits(bits).to_f64(),
                        _ => bf16::from_bits(bits).to_f64(),
                    }
                }).collect()
            };
            let inputs: Vec<Vec<u8>> = ranks.iter().map(|r| enc(r)).collect();
            let mut acc = inputs[0].clone();
            for x in &inputs[1..] {
                let mut next = vec![0u8; acc.len()];
                reduce_copy(datatype, RedOp::Sum, &mut next, &acc, x).unwrap();
                acc = next;
            }
            let got = dec(&acc);
            let exact: Vec<Vec<f64>> = inputs.iter().map(|b| dec(b)).collect();
            let k = inputs.len() as f64;
            for i in 0..got.len() {
                let sum: f64 = exact.iter().map(|r| r[i]).sum();
                let abs: f64 = exact.iter().map(|r| r[i].abs()).sum();
                let bound = (k - 1.0) * u * abs;
                prop_assert!((got[i] - sum).abs() <= bound,
                    "{datatype:?} element {i}: {} vs exact {sum}, bound {bound}", got[i]);
            }
        }
    }
}
