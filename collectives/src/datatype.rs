//! Element types and reduction operators: NCCL's `ncclDataType_t` and `ncclRedOp_t`.
//!
//! A collective moves `count` elements of one [`DataType`]; the reducing collectives (all-reduce,
//! reduce, reduce-scatter) combine them element-wise with a [`RedOp`]. Names and numbering follow
//! NCCL (`nccl.h`) so that a value printed here reads the same as in nccl-tests' output
//! (`float`, `half`, `bfloat16`, ...; `sum`, `prod`, `max`, `min`, `avg`).

use core::fmt;
use core::str::FromStr;

use half::{bf16, f16};

/// The element type of a collective's buffers (NCCL `ncclDataType_t`).
///
/// Every type is stored in native byte order; the discriminant is NCCL's enum value and is what
/// travels in a slot header ([`crate::transport::OpDesc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// `ncclInt8`: signed 8-bit integer.
    I8 = 0,
    /// `ncclUint8`: unsigned 8-bit integer.
    U8 = 1,
    /// `ncclInt32`: signed 32-bit integer.
    I32 = 2,
    /// `ncclUint32`: unsigned 32-bit integer.
    U32 = 3,
    /// `ncclInt64`: signed 64-bit integer.
    I64 = 4,
    /// `ncclUint64`: unsigned 64-bit integer.
    U64 = 5,
    /// `ncclFloat16`: IEEE 754 binary16 (`half::f16`).
    F16 = 6,
    /// `ncclFloat32`: IEEE 754 binary32.
    F32 = 7,
    /// `ncclFloat64`: IEEE 754 binary64.
    F64 = 8,
    /// `ncclBfloat16`: bfloat16 (`half::bf16`): binary32's exponent with an 8-bit significand.
    Bf16 = 9,
}

impl DataType {
    /// Every data type, in NCCL's enum order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Size of one element, in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type (`avg` then divides in floating point).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// nccl-tests' name for the type (`int8`, `uint8`, `int32`, `uint32`, `int64`, `uint64`,
    /// `half`, `float`, `double`, `bfloat16`).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// The type with NCCL enum value `raw`, if there is one.
    pub const fn from_raw(raw: u8) -> Option<DataType> {
        match raw {
            0 => Some(DataType::I8),
            1 => Some(DataType::U8),
            2 => Some(DataType::I32),
            3 => Some(DataType::U32),
            4 => Some(DataType::I64),
            5 => Some(DataType::U64),
            6 => Some(DataType::F16),
            7 => Some(DataType::F32),
            8 => Some(DataType::F64),
            9 => Some(DataType::Bf16),
            _ => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A type name that is not one of nccl-tests' names or NCCL's aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What was given.
    pub given: String,
    /// What kind of name was expected (`data type`, `reduction op`).
    pub kind: &'static str,
    /// The accepted names.
    pub accepted: &'static str,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} '{}' (expected one of: {})",
            self.kind, self.given, self.accepted
        )
    }
}

impl std::error::Error for UnknownName {}

impl FromStr for DataType {
    type Err = UnknownName;

    /// Parses nccl-tests' names (`float`, `half`, ...) and NCCL's aliases (`int`, `char`,
    /// `float16`, `float32`, `float64`, `f32`, `bf16`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "int8" | "char" | "i8" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "int" | "i32" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "float16" | "f16" => DataType::F16,
            "float" | "float32" | "f32" => DataType::F32,
            "double" | "float64" | "f64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            _ => {
                return Err(UnknownName {
                    given: s.to_string(),
                    kind: "data type",
                    accepted: "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16",
                })
            }
        })
    }
}

/// A reduction operator (NCCL `ncclRedOp_t`).
///
/// Integer `sum` and `prod` wrap on overflow (two's complement), as NCCL's device code does.
/// Floating-point `min`/`max` follow IEEE 754 `minNum`/`maxNum` (Rust's `f32::min`): a NaN operand
/// yields the other operand.
///
/// `avg` is NCCL's `ncclAvg`: the sum of all ranks' elements divided by `nranks`, the division
/// done once at the end on the complete sum (NCCL's `SumPostDiv`). For integers the division
/// truncates toward zero (C and Rust `/`), applied to the wrapped sum. For floating-point types
/// NCCL instead pre-multiplies each input by `1/nranks` (`PreMulSum`); this crate divides the
/// finished sum, which rounds once rather than `nranks` times and keeps `avg` equal to `sum / n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg`: sum, then divide by `nranks` at the end.
    Avg = 4,
}

impl RedOp {
    /// Every operator, in NCCL's enum order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// nccl-tests' name for the operator.
    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }

    /// The operator with NCCL enum value `raw`, if there is one.
    pub const fn from_raw(raw: u8) -> Option<RedOp> {
        match raw {
            0 => Some(RedOp::Sum),
            1 => Some(RedOp::Prod),
            2 => Some(RedOp::Max),
            3 => Some(RedOp::Min),
            4 => Some(RedOp::Avg),
            _ => None,
        }
    }

    /// The element-wise operator the reduction steps apply (`avg` reduces with `sum`).
    pub const fn step_op(self) -> RedOp {
        match self {
            RedOp::Avg => RedOp::Sum,
            op => op,
        }
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RedOp {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" => RedOp::Avg,
            _ => {
                return Err(UnknownName {
                    given: s.to_string(),
                    kind: "reduction op",
                    accepted: "sum prod max min avg",
                })
            }
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is one of the collective [`DataType`]s: lets the typed entry points
/// (`all_reduce_slice`, ...) take `&[f32]` instead of bytes plus a data type.
///
/// Sealed: implemented for `i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64` only.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The matching data type.
    const DATATYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATATYPE: DataType = DataType::$d;
        }
    )*};
}

element! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f16 => F16, bf16 => Bf16, f32 => F32, f64 => F64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
            assert_eq!(DataType::from_raw(d as u8), Some(d));
        }
        for op in RedOp::ALL {
            assert_eq!(op.name().parse::<RedOp>().unwrap(), op);
            assert_eq!(RedOp::from_raw(op as u8), Some(op));
        }
        assert!("float128".parse::<DataType>().is_err());
        assert!("xor".parse::<RedOp>().is_err());
        assert_eq!(DataType::from_raw(10), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DataType::Bf16.size(), 2);
        assert_eq!(DataType::F64.size(), 8);
        assert_eq!(DataType::U8.size(), 1);
        assert_eq!(<f16 as Element>::DATATYPE, DataType::F16);
    }
}
