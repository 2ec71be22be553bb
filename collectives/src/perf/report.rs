//! nccl-tests' arithmetic and text: sizes, element counts, bus-bandwidth factors, and the
//! fixed-width table (`src/common.cu`, `src/util.cu` and the per-collective `*.cu` files of
//! nccl-tests).

use core::fmt;

use super::collective::Collective;

/// Parses a byte size as nccl-tests' `parsesize` does: a number with an optional `K`, `M` or
/// `G` suffix (powers of 1024, either case), e.g. `8`, `1K`, `64M`, `1.5G`.
///
/// # Errors
/// A message for anything else, and for sizes of 2^64 bytes or more ("too large").
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, ""),
    };
    let mult: u64 = match unit {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => {
            return Err(format!(
                "invalid size '{s}' (a number with an optional K, M or G)"
            ))
        }
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size '{s}' (a number with an optional K, M or G)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("invalid size '{s}'"));
    }
    let bytes = v * mult as f64;
    // 2^64 (`u64::MAX as f64` rounds up to it): a cast would saturate to u64::MAX.
    if bytes >= u64::MAX as f64 {
        return Err(format!(
            "size '{s}' is too large (at most {} bytes, 16 EiB)",
            u64::MAX
        ));
    }
    Ok(bytes as u64)
}

/// The counts nccl-tests derives from a size (`*GetCollByteCount`): elements per rank-buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Elements in each rank's send buffer.
    pub send: usize,
    /// Elements in each rank's receive buffer.
    pub recv: usize,
    /// The `count` argument of the call (and the table's count column).
    pub param: usize,
}

impl Counts {
    /// Counts for `bytes` of `elem_size`-byte elements over `nranks` ranks. Per-rank blocks are
    /// rounded down to a multiple of 16 bytes, as nccl-tests does.
    pub fn new(coll: Collective, bytes: u64, elem_size: usize, nranks: usize) -> Counts {
        let count = (bytes / elem_size as u64) as usize;
        let align = (16 / elem_size).max(1);
        let base = (count / nranks) & !(align - 1);
        match coll {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => {
                Self::for_param(coll, count, nranks)
            }
            _ => Self::for_param(coll, base, nranks),
        }
    }

    /// Buffer sizes of a call with `count` argument `param`.
    pub fn for_param(coll: Collective, param: usize, nranks: usize) -> Counts {
        let (send, recv) = match coll {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (param, param),
            // Saturating: an impossible size then fails its allocation instead of wrapping.
            Collective::AllGather | Collective::Gather => (param, param.saturating_mul(nranks)),
            Collective::ReduceScatter | Collective::Scatter => {
                (param.saturating_mul(nranks), param)
            }
            Collective::AllToAll => (param.saturating_mul(nranks), param.saturating_mul(nranks)),
        };
        Counts { send, recv, param }
    }

    /// The table's size column: the larger buffer, in bytes.
    pub fn size_bytes(&self, elem_size: usize) -> usize {
        self.send.max(self.recv) * elem_size
    }
}

/// nccl-tests' `*GetBw`: (algbw, busbw) in GB/s for `param` elements moved in `seconds`.
pub fn bandwidth(
    coll: Collective,
    param: usize,
    elem_size: usize,
    seconds: f64,
    nranks: usize,
) -> (f64, f64) {
    let n = nranks as f64;
    let bytes = match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => param * elem_size,
        _ => param * elem_size * nranks,
    } as f64;
    let algbw = bytes / 1.0e9 / seconds;
    let factor = match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Scatter
        | Collective::Gather => (n - 1.0) / n,
    };
    (algbw, algbw * factor)
}

/// nccl-tests' `getFloatStr`: `%*.2f`, else `%*.1f`, else `%*.0f`, else exponent form, the
/// first that fits `width`.
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = if width >= 7 {
        c_exp(value, 1)
    } else {
        c_exp(value, 0)
    };
    format!("{s:>width$}")
}

/// C's `%.{prec}e` (two-digit exponent with sign).
fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// C's `%g`: six significant digits, trailing zeros dropped, exponent form outside
/// `1e-4 ..= 1e6`.
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return format!("{value}");
    }
    let exp = value.abs().log10().floor() as i32;
    let strip = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if !(-4..6).contains(&exp) {
        let s = c_exp(value, 5);
        match s.split_once('e') {
            Some((m, e)) => format!("{}e{e}", strip(m.to_string())),
            None => s,
        }
    } else {
        let prec = (5 - exp).max(0) as usize;
        strip(format!("{value:.prec$}"))
    }
}

/// One table row's left part: size, count, type, redop, root.
pub fn row_preamble(
    size: usize,
    count: usize,
    type_name: &str,
    op_name: &str,
    root: i64,
) -> String {
    format!("{size:>12}  {count:>12}  {type_name:>8}  {op_name:>6}  {root:>6}")
}

/// One table row's measurement: time (us), algbw, busbw, #wrong (`None`: not checked, `N/A`).
pub fn row_body(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let (t, a, b) = (
        float_str(time_us, 7),
        float_str(algbw, 6),
        float_str(busbw, 6),
    );
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// The column headers (three lines, each ending in a newline).
pub struct TableHeader;

impl fmt::Display for TableHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = "";
        writeln!(
            f,
            "# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place          "
        )?;
        writeln!(
            f,
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
            "algbw", "busbw", "#wrong"
        )?;
        writeln!(
            f,
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
            "(GB/s)", ""
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1K").is_err());
        // Beyond u64: refused, not saturated to u64::MAX.
        for s in ["99999999999G", "17179869184G", "18446744073709551616"] {
            let e = parse_size(s).unwrap_err();
            assert!(e.contains("too large"), "{s}: {e}");
        }
        assert_eq!(parse_size("15000000000G"), Ok(15_000_000_000 << 30));
    }

    #[test]
    fn counts_and_factors_follow_nccl_tests() {
        let c = Counts::new(Collective::AllGather, 1 << 20, 4, 4);
        assert_eq!((c.send, c.recv, c.param), (65536, 262144, 65536));
        assert_eq!(c.size_bytes(4), 1 << 20);
        // Blocks are rounded down to 16 bytes: 100 floats over 3 ranks -> 32 each.
        let c = Counts::new(Collective::ReduceScatter, 400, 4, 3);
        assert_eq!((c.send, c.recv, c.param), (96, 32, 32));
        let (alg, bus) = bandwidth(Collective::AllReduce, 250_000_000, 4, 1.0, 4);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 1.5).abs() < 1e-12);
        let (alg, bus) = bandwidth(Collective::AllGather, 250_000_000 / 4, 4, 1.0, 4);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 0.75).abs() < 1e-12);
        let (_, bus) = bandwidth(Collective::Broadcast, 10, 4, 1.0, 8);
        assert_eq!(bus, 4e-8);
    }

    #[test]
    fn number_formats_match_c() {
        assert_eq!(float_str(17.9412, 7), "  17.94");
        assert_eq!(float_str(123456.0, 7), " 123456");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.001, 6), "  0.00");
        assert_eq!(float_str(1234.567, 6), "1234.6");
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(12.0), "12");
        assert_eq!(c_g(1.5), "1.5");
        assert_eq!(c_g(2.345678), "2.34568");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(
            row_preamble(1024, 256, "float", "sum", -1).len(),
            12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6
        );
        assert_eq!(
            row_body(1.0, 2.0, 3.0, None),
            "     1.00    2.00    3.00    N/A"
        );
    }
}
