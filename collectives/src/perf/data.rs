//! Test data for `coll-perf` and its reference check.
//!
//! Every rank fills its inputs with small integers that are exact in every data type (`|v| <= 4`
//! for sums, `1` or `2` (and `-1` for signed types) for products), derived from
//! `(rank, element index, repetition)`. A reduction over up to 64 ranks of such values is exact in
//! every type, so the expected result does not depend on the reduction order and every rank can
//! compute it independently: the output is compared element by element, and the number of
//! elements that differ is nccl-tests' `#wrong`.
//!
//! The reference arithmetic here is scalar and separate from the kernels of
//! [`crate::reduce`]: integers wrap in their own width, `f16`/`bf16` go through `f32` and round
//! after every operation, `avg` divides the finished sum (integers truncating).

use half::{bf16, f16};

use crate::datatype::{DataType, RedOp};

/// The data of one check: which values each rank contributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// Element type.
    pub datatype: DataType,
    /// Reduction operator (decides the value range).
    pub op: RedOp,
    /// Ranks.
    pub nranks: usize,
    /// Repetition (changes the values from one check to the next).
    pub rep: u64,
}

/// Where an output element's expected value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Rank `rank`'s input element `index`.
    Value {
        /// The rank.
        rank: usize,
        /// Index into that rank's input.
        index: usize,
    },
    /// The reduction over all ranks of input element `index`.
    Reduced {
        /// Index into every rank's input.
        index: usize,
    },
}

fn mix(rank: usize, index: usize, rep: u64) -> u64 {
    let mut x = (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (index as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ rep.wrapping_mul(0x1656_67b1_9e37_79f9);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 32)
}

/// Scalar arithmetic of one element type.
trait Num: Copy + PartialEq {
    const SIZE: usize;
    fn from_i64(v: i64) -> Self;
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
    fn apply(op: RedOp, a: Self, b: Self) -> Self;
    fn div(self, n: usize) -> Self;
    fn same(self, other: Self) -> bool {
        self == other
    }
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            fn from_i64(v: i64) -> Self { v as $t }
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            fn write(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            fn apply(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Min => a.min(b),
                    RedOp::Max => a.max(b),
                }
            }
            fn div(self, n: usize) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}

num_int!(i8, u8, i32, u32, i64, u64);

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            fn from_i64(v: i64) -> Self { v as $t }
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            fn write(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            fn apply(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a + b,
                    RedOp::Prod => a * b,
                    RedOp::Min => a.min(b),
                    RedOp::Max => a.max(b),
                }
            }
            fn div(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}

num_float!(f32, f64);

macro_rules! num_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const SIZE: usize = 2;
            fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
            fn read(b: &[u8]) -> Self { <$t>::from_bits(u16::from_ne_bytes([b[0], b[1]])) }
            fn write(self, b: &mut [u8]) { b.copy_from_slice(&self.to_bits().to_ne_bytes()) }
            fn apply(op: RedOp, a: Self, b: Self) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                <$t>::from_f32(match op {
                    RedOp::Sum | RedOp::Avg => x + y,
                    RedOp::Prod => x * y,
                    RedOp::Min => x.min(y),
                    RedOp::Max => x.max(y),
                })
            }
            fn div(self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
        }
    )*};
}

num_half!(f16, bf16);

macro_rules! dispatch {
    ($dt:expr, $f:ident, $($arg:expr),*) => {
        match $dt {
            DataType::I8 => $f::<i8>($($arg),*),
            DataType::U8 => $f::<u8>($($arg),*),
            DataType::I32 => $f::<i32>($($arg),*),
            DataType::U32 => $f::<u32>($($arg),*),
            DataType::I64 => $f::<i64>($($arg),*),
            DataType::U64 => $f::<u64>($($arg),*),
            DataType::F16 => $f::<f16>($($arg),*),
            DataType::Bf16 => $f::<bf16>($($arg),*),
            DataType::F32 => $f::<f32>($($arg),*),
            DataType::F64 => $f::<f64>($($arg),*),
        }
    };
}

impl Pattern {
    /// The integer rank `rank` holds at input element `index`.
    pub fn value(&self, rank: usize, index: usize) -> i64 {
        let h = mix(rank, index, self.rep);
        let signed = !matches!(self.datatype, DataType::U8 | DataType::U32 | DataType::U64);
        match self.op {
            RedOp::Prod if signed && h % 11 == 0 => -1,
            RedOp::Prod => 1 + i64::from(h % 4 == 0),
            _ if signed => (h % 9) as i64 - 4,
            _ => (h % 9) as i64,
        }
    }

    /// Writes rank `rank`'s input elements `first .. first + buf.len() / size` into `buf`.
    pub fn fill(&self, rank: usize, buf: &mut [u8], first: usize) {
        fn go<T: Num>(p: &Pattern, rank: usize, buf: &mut [u8], first: usize) {
            for (k, b) in buf.chunks_exact_mut(T::SIZE).enumerate() {
                T::from_i64(p.value(rank, first + k)).write(b);
            }
        }
        dispatch!(self.datatype, go, self, rank, buf, first)
    }

    fn expected<T: Num>(&self, e: Expect) -> T {
        match e {
            Expect::Value { rank, index } => T::from_i64(self.value(rank, index)),
            Expect::Reduced { index } => {
                let mut acc = T::from_i64(self.value(0, index));
                for r in 1..self.nranks {
                    acc = T::apply(self.op, acc, T::from_i64(self.value(r, index)));
                }
                if self.op == RedOp::Avg {
                    acc = acc.div(self.nranks);
                }
                acc
            }
        }
    }

    /// Counts the elements of `out` (element `k` expected per `expect(k)`) that differ.
    pub fn count_wrong(&self, out: &[u8], expect: impl Fn(usize) -> Expect) -> u64 {
        fn go<T: Num>(p: &Pattern, out: &[u8], expect: &dyn Fn(usize) -> Expect) -> u64 {
            out.chunks_exact(T::SIZE)
                .enumerate()
                .filter(|(k, b)| !T::read(b).same(p.expected::<T>(expect(*k))))
                .count() as u64
        }
        dispatch!(self.datatype, go, self, out, &expect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_data_checks_clean_and_corruption_is_counted() {
        for datatype in DataType::ALL {
            for op in RedOp::ALL {
                let p = Pattern {
                    datatype,
                    op,
                    nranks: 3,
                    rep: 7,
                };
                let mut buf = vec![0u8; 10 * datatype.size()];
                p.fill(2, &mut buf, 5);
                assert_eq!(
                    p.count_wrong(&buf, |k| Expect::Value {
                        rank: 2,
                        index: 5 + k
                    }),
                    0
                );
                buf[0] ^= 0x40;
                assert_eq!(
                    p.count_wrong(&buf, |k| Expect::Value {
                        rank: 2,
                        index: 5 + k
                    }),
                    1
                );
            }
        }
    }

    #[test]
    fn reduced_expectation_matches_a_hand_fold() {
        let p = Pattern {
            datatype: DataType::I32,
            op: RedOp::Avg,
            nranks: 4,
            rep: 1,
        };
        let sum: i64 = (0..4).map(|r| p.value(r, 9)).sum();
        let mut b = [0u8; 4];
        ((sum / 4) as i32).write(&mut b);
        assert_eq!(p.count_wrong(&b, |_| Expect::Reduced { index: 9 }), 0);
    }
}
