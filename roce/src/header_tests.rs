//! The tests that every fixed-length header module (BTH, AETH, DETH, RETH, IETH, ImmDt) runs
//! against its own golden bytes, written once as macros. Each macro expands inside the header's
//! `test` module and uses that module's `Packet`, `Repr` and `HEADER_LEN`.

/// `#[test] fn parse_and_emit`: the golden `$bytes` parse to `$repr`, which emits exactly
/// `$bytes` into a 0xa5-filled buffer and reports `$bytes.len()` as its `buffer_len`.
macro_rules! test_parse_and_emit {
    ($bytes:expr, $repr:expr) => {
        #[test]
        fn parse_and_emit() {
            assert_eq!(
                Repr::parse(&Packet::new_checked(&$bytes[..]).unwrap()),
                Ok($repr)
            );
            let mut buf = [0xa5u8; HEADER_LEN];
            $repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            assert_eq!(buf, $bytes);
            assert_eq!($repr.buffer_len(), $bytes.len());
        }
    };
}

/// `#[test] fn truncated`: every proper prefix of the golden `$bytes` is refused, by
/// `Packet::new_checked` as [`Error::Truncated`](crate::Error::Truncated) at `$layer` (needing
/// `$bytes.len()` bytes) and by `Repr::parse`.
macro_rules! test_truncated {
    ($layer:expr, $bytes:expr) => {
        #[test]
        fn truncated() {
            for len in 0..HEADER_LEN {
                assert_eq!(
                    Packet::new_checked(&$bytes[..len]),
                    Err(crate::Error::Truncated {
                        layer: $layer,
                        need: $bytes.len(),
                        got: len
                    })
                );
                assert!(Repr::parse(&Packet::new_unchecked(&$bytes[..len])).is_err());
            }
        }
    };
}

/// Property `arbitrary_bytes_never_panic`: `Packet::new_checked` and `Repr::parse` return on
/// any buffer whose length is in `$lens`.
macro_rules! test_arbitrary_bytes_never_panic {
    ($lens:expr) => {
        proptest::proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(
                data in proptest::collection::vec(proptest::prelude::any::<u8>(), $lens)
            ) {
                if let Ok(p) = Packet::new_checked(&data[..]) {
                    let _ = Repr::parse(&p);
                }
            }
        }
    };
}
