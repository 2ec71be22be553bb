/// Declares an open enum over a raw integer type: every named value gets a variant and any other value
/// maps to `Unknown(raw)`, so converting untrusted input never fails or panics (the smoltcp pattern).
///
/// ```ignore
/// enum_with_unknown! {
///     /// Doc for the enum.
///     pub enum EtherType(u16) {
///         /// IPv4
///         Ipv4 = 0x0800,
///     }
/// }
/// ```
macro_rules! enum_with_unknown {
    (
        $( #[$enum_attr:meta] )*
        pub enum $name:ident($ty:ty) {
            $(
              $( #[$variant_attr:meta] )*
              $variant:ident = $value:expr
            ),+ $(,)?
        }
    ) => {
        $( #[$enum_attr] )*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone, Copy)]
        pub enum $name {
            $(
              $( #[$variant_attr] )*
              $variant
            ),*,
            /// A value this crate has no name for; carried unchanged.
            Unknown($ty)
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( value if value == $value => $name::$variant ),*,
                    other => $name::Unknown(other)
                }
            }
        }

        impl $name {
            /// The raw value, as `<$ty>::from` gives it, usable in `const` contexts (tables).
            #[allow(dead_code)]
            pub(crate) const fn to_raw(self) -> $ty {
                match self {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                value.to_raw()
            }
        }
    }
}
