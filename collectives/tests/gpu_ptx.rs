//! The GPU kernels' PTX, checked without a GPU or `ptxas`: a validator for the PTX subset the
//! kernels use (module header, declared registers of the right class for each instruction, defined
//! labels and parameters, every entry ending in `ret`) and an interpreter of that subset that runs
//! every kernel on a simulated grid (several blocks, grid-stride loop exercised) and compares the
//! bytes with the host kernels of `collectives::reduce`, which the CPU path uses.
//!
//! Semantics follow the PTX ISA 7.0 reference (sections 9.7.x of the instructions named); the
//! interpreter is the test's model of them, so what it catches is a kernel that computes the wrong
//! thing under that model (wrong offsets, registers, loop bounds, operand order, rounding step).

use std::collections::HashMap;

use collectives::reduce::{divide_in_place, reduce_copy};
use collectives::{DataType, RedOp};
use gpu_p2p::cuda::{
    divide_kernel_name, reduce_kernel_name, ElemType, ReduceOp, ATOMICS_PTX, REDUCE_PTX,
};

#[derive(Debug, Clone)]
struct Insn {
    guard: Option<String>,
    op: String,
    args: Vec<String>,
}

#[derive(Debug, Default)]
struct Entry {
    params: Vec<String>,
    regs: HashMap<String, (String, usize)>, // prefix -> (type, count)
    insns: Vec<Insn>,
    labels: HashMap<String, usize>,
}

fn strip_comment(l: &str) -> &str {
    l.split("//").next().unwrap_or("").trim()
}

/// Parses (and structurally validates) a module; returns its entries by name.
fn parse_module(text: &str) -> HashMap<String, Entry> {
    let lines: Vec<&str> = text
        .lines()
        .map(strip_comment)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        lines[0].starts_with(".version "),
        "module starts with .version"
    );
    let version: f32 = lines[0][9..].trim().parse().expect("version number");
    assert!(
        (7.0..=8.0).contains(&version),
        "PTX ISA {version}: CUDA 12 drivers accept 7.0 to 8.x"
    );
    assert!(lines[1].starts_with(".target sm_"), "then .target");
    assert_eq!(lines[2], ".address_size 64");
    let mut entries = HashMap::new();
    let mut i = 3;
    while i < lines.len() {
        let head = lines[i];
        assert!(
            head.starts_with(".visible .entry ") && head.ends_with('('),
            "entry header: {head}"
        );
        let name = head[16..head.len() - 1].to_string();
        let mut e = Entry::default();
        i += 1;
        while lines[i] != ")" {
            let p = lines[i].trim_end_matches(',');
            let p = p
                .strip_prefix(".param .u64 ")
                .unwrap_or_else(|| panic!("param: {p}"));
            e.params.push(p.to_string());
            i += 1;
        }
        assert_eq!(lines[i + 1], "{");
        i += 2;
        while lines[i] != "}" {
            let l = lines[i];
            i += 1;
            if let Some(decl) = l.strip_prefix(".reg .") {
                let (ty, rest) = decl.split_once(' ').unwrap();
                let rest = rest.trim_end_matches(';');
                let (prefix, n) = rest.split_once('<').unwrap();
                let n: usize = n.trim_end_matches('>').parse().unwrap();
                assert!(e
                    .regs
                    .insert(prefix.to_string(), (ty.to_string(), n))
                    .is_none());
                continue;
            }
            if let Some(label) = l.strip_suffix(':') {
                assert!(e.labels.insert(label.to_string(), e.insns.len()).is_none());
                continue;
            }
            let l = l
                .strip_suffix(';')
                .unwrap_or_else(|| panic!("{name}: no ';': {l}"));
            let (guard, l) = match l.strip_prefix('@') {
                Some(g) => {
                    let (g, rest) = g.split_once(' ').unwrap();
                    (Some(g.to_string()), rest)
                }
                None => (None, l),
            };
            let (op, args) = l.split_once(' ').unwrap_or((l, ""));
            let args = args
                .split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect();
            e.insns.push(Insn {
                guard,
                op: op.to_string(),
                args,
            });
        }
        i += 1;
        validate(&name, &e);
        assert!(entries.insert(name, e).is_none(), "duplicate entry");
    }
    entries
}

/// Register prefix and index of `%rd12`.
fn reg_parts(r: &str) -> (&str, usize) {
    let digits = r.trim_start_matches(|c: char| !c.is_ascii_digit());
    let prefix = &r[..r.len() - digits.len()];
    (prefix, digits.parse().unwrap_or(usize::MAX))
}

fn type_bits(t: &str) -> usize {
    match t {
        "pred" => 1,
        "b8" | "s8" | "u8" => 8,
        "b16" | "s16" | "u16" | "f16" | "bf16" => 16,
        "b32" | "s32" | "u32" | "f32" => 32,
        "b64" | "s64" | "u64" | "f64" => 64,
        _ => panic!("unknown type .{t}"),
    }
}

fn validate(name: &str, e: &Entry) {
    assert_eq!(
        e.insns.last().map(|i| i.op.as_str()),
        Some("ret"),
        "{name} ends with ret"
    );
    for ins in &e.insns {
        let parts: Vec<&str> = ins.op.split('.').collect();
        let base = parts[0];
        let known = [
            "ld", "st", "cvta", "mov", "mul", "cvt", "add", "setp", "bra", "shl", "min", "max",
            "div", "atom", "ret",
        ];
        assert!(known.contains(&base), "{name}: unknown opcode {}", ins.op);
        if let Some(g) = &ins.guard {
            let (p, idx) = reg_parts(g);
            let (t, n) = &e.regs[p];
            assert!(t == "pred" && idx < *n, "{name}: guard {g}");
        }
        if base == "bra" {
            assert!(
                e.labels.contains_key(&ins.args[0]),
                "{name}: label {}",
                ins.args[0]
            );
            continue;
        }
        // The instruction's data type: the last suffix (for cvt, the destination is the first type).
        let types: Vec<&str> = parts
            .iter()
            .skip(1)
            .copied()
            .filter(|s| {
                ![
                    "param", "global", "to", "rn", "lo", "wide", "uni", "ge", "cas", "add",
                ]
                .contains(s)
            })
            .collect();
        for (k, a) in ins.args.iter().enumerate() {
            let a = a.trim_start_matches('[').trim_end_matches(']');
            if !a.starts_with('%') {
                if base == "ld" && parts[1] == "param" {
                    assert!(e.params.iter().any(|p| p == a), "{name}: param {a}");
                } else {
                    assert!(
                        a.parse::<u64>().is_ok(),
                        "{name}: operand {a} in {}",
                        ins.op
                    );
                }
                continue;
            }
            if a.starts_with("%ctaid")
                || a.starts_with("%ntid")
                || a.starts_with("%tid")
                || a.starts_with("%nctaid")
            {
                assert_eq!(
                    ins.op, "mov.u32",
                    "{name}: special registers are read by mov.u32"
                );
                continue;
            }
            let (p, idx) = reg_parts(a);
            let (rt, n) = e
                .regs
                .get(p)
                .unwrap_or_else(|| panic!("{name}: undeclared register {a}"));
            assert!(idx < *n, "{name}: {a} beyond %{p}<{n}>");
            if rt == "pred" {
                assert_eq!(base, "setp", "{name}: predicate {a} used by {}", ins.op);
                continue;
            }
            // Which type governs this operand: cvt's destination has the first, its source the
            // second; mul.wide's destination is twice the source width; st's address is 64-bit.
            let rbits = type_bits(rt);
            let is_addr = ins.args[k].starts_with('[');
            let want = if is_addr {
                64
            } else {
                let t = match (base, k) {
                    ("cvt", 0) => types[0],
                    ("cvt", _) => types[1],
                    _ => types[types.len() - 1],
                };
                let bits = type_bits(t);
                match (base, k) {
                    ("mul", 0) if parts.contains(&"wide") => bits * 2,
                    ("shl", 2) => 32,
                    _ => bits,
                }
            };
            let narrow_ok =
                matches!(base, "ld" | "st" | "cvt") && want < rbits && !rt.starts_with('f');
            assert!(
                want == rbits || narrow_ok,
                "{name}: {} operand {a} is .{rt}, instruction wants {want} bits",
                ins.op
            );
            let float_insn = types
                .iter()
                .any(|t| t.starts_with('f') && *t != "f16" || *t == "bf16");
            if rt.starts_with('f') && !matches!(base, "ld" | "st" | "cvt" | "mov") {
                assert!(
                    float_insn,
                    "{name}: float register {a} in integer {}",
                    ins.op
                );
            }
        }
    }
}

// ---- interpreter

struct Mem {
    base: u64,
    bytes: Vec<u8>,
}

impl Mem {
    fn at(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let off = addr.checked_sub(self.base).expect("address below memory") as usize;
        assert!(
            off + len <= self.bytes.len(),
            "address {addr:#x} out of memory"
        );
        &mut self.bytes[off..off + len]
    }
    fn load(&mut self, addr: u64, len: usize) -> u64 {
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(self.at(addr, len));
        u64::from_le_bytes(v)
    }
    fn store(&mut self, addr: u64, len: usize, v: u64) {
        self.at(addr, len).copy_from_slice(&v.to_le_bytes()[..len]);
    }
}

fn f32b(v: u64) -> f32 {
    f32::from_bits(v as u32)
}
fn f64b(v: u64) -> f64 {
    f64::from_bits(v)
}
fn fmin<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, min: bool) -> T {
    if nan(a) {
        return b;
    }
    if nan(b) {
        return a;
    }
    if (a < b) == min {
        a
    } else {
        b
    }
}

fn run(e: &Entry, args: &[u64], grid: u32, block: u32, mem: &mut Mem) {
    assert_eq!(args.len(), e.params.len(), "argument count");
    for ctaid in 0..grid {
        for tid in 0..block {
            let mut regs: HashMap<String, u64> = HashMap::new();
            let mut pc = 0usize;
            let mut steps = 0u64;
            loop {
                steps += 1;
                assert!(steps < 10_000_000, "runaway kernel");
                let ins = &e.insns[pc];
                pc += 1;
                if let Some(g) = &ins.guard {
                    if regs.get(g).copied().unwrap_or(0) == 0 {
                        continue;
                    }
                }
                let a = &ins.args;
                let val = |regs: &HashMap<String, u64>, s: &str| -> u64 {
                    match s {
                        "%ctaid.x" => u64::from(ctaid),
                        "%ntid.x" => u64::from(block),
                        "%tid.x" => u64::from(tid),
                        "%nctaid.x" => u64::from(grid),
                        _ if s.starts_with('%') => {
                            *regs.get(s).unwrap_or_else(|| panic!("read of unset {s}"))
                        }
                        _ => s.parse().unwrap(),
                    }
                };
                let addr = |regs: &HashMap<String, u64>, s: &str| {
                    val(regs, s.trim_start_matches('[').trim_end_matches(']'))
                };
                let op = ins.op.as_str();
                let parts: Vec<&str> = op.split('.').collect();
                let ty = *parts.last().unwrap();
                let mask = |v: u64, bits: usize| {
                    if bits >= 64 {
                        v
                    } else {
                        v & ((1u64 << bits) - 1)
                    }
                };
                let r = match parts[0] {
                    "ret" => break,
                    "bra" => {
                        pc = e.labels[&a[0]];
                        continue;
                    }
                    "ld" if parts[1] == "param" => {
                        let i = e
                            .params
                            .iter()
                            .position(|p| *p == a[1].trim_matches(|c| c == '[' || c == ']'))
                            .unwrap();
                        args[i]
                    }
                    "ld" => {
                        let bits = type_bits(ty);
                        let v = mem.load(addr(&regs, &a[1]), bits / 8);
                        match ty {
                            "s8" => (v as u8 as i8 as i32 as u32) as u64,
                            _ => v,
                        }
                    }
                    "st" => {
                        let v = val(&regs, &a[1]);
                        mem.store(addr(&regs, &a[0]), type_bits(ty) / 8, v);
                        continue;
                    }
                    "atom" => {
                        let p = addr(&regs, &a[1]);
                        let old = mem.load(p, 8);
                        let new = match parts[2] {
                            "cas" => {
                                if old == val(&regs, &a[2]) {
                                    val(&regs, &a[3])
                                } else {
                                    old
                                }
                            }
                            "add" => old.wrapping_add(val(&regs, &a[2])),
                            o => panic!("atom.{o}"),
                        };
                        mem.store(p, 8, new);
                        old
                    }
                    "cvta" | "mov" => val(&regs, &a[1]),
                    "cvt" => {
                        let x = val(&regs, &a[1]);
                        let (dt, st) = (parts[parts.len() - 2], ty);
                        match (dt, st) {
                            ("u64", "u32") | ("u32", "u64") => x & 0xffff_ffff,
                            ("u32", "u16") => x & 0xffff,
                            ("f32", "f16") => {
                                u64::from(half::f16::from_bits(x as u16).to_f32().to_bits())
                            }
                            ("f16", "f32") => u64::from(half::f16::from_f32(f32b(x)).to_bits()),
                            ("bf16", "f32") => u64::from(half::bf16::from_f32(f32b(x)).to_bits()),
                            ("f32", "u64") => u64::from((x as f32).to_bits()),
                            ("f64", "u64") => (x as f64).to_bits(),
                            other => panic!("cvt {other:?}"),
                        }
                    }
                    "setp" => {
                        assert_eq!(op, "setp.ge.u64");
                        u64::from(val(&regs, &a[1]) >= val(&regs, &a[2]))
                    }
                    "shl" => mask(val(&regs, &a[1]) << val(&regs, &a[2]), type_bits(ty)),
                    "mul" if parts[1] == "wide" => {
                        mask(val(&regs, &a[1]), 32) * mask(val(&regs, &a[2]), 32)
                    }
                    base @ ("add" | "mul" | "min" | "max" | "div") => {
                        let (x, y) = (val(&regs, &a[1]), val(&regs, &a[2]));
                        let bits = type_bits(ty);
                        let sx = |v: u64| -> i64 {
                            if bits == 32 {
                                v as u32 as i32 as i64
                            } else {
                                v as i64
                            }
                        };
                        let res: u64 = match (base, ty) {
                            ("add", "f32") => u64::from((f32b(x) + f32b(y)).to_bits()),
                            ("mul", "f32") => u64::from((f32b(x) * f32b(y)).to_bits()),
                            ("div", "f32") => u64::from((f32b(x) / f32b(y)).to_bits()),
                            ("min", "f32") => {
                                u64::from(fmin(f32b(x), f32b(y), f32::is_nan, true).to_bits())
                            }
                            ("max", "f32") => {
                                u64::from(fmin(f32b(x), f32b(y), f32::is_nan, false).to_bits())
                            }
                            ("add", "f64") => (f64b(x) + f64b(y)).to_bits(),
                            ("mul", "f64") => (f64b(x) * f64b(y)).to_bits(),
                            ("div", "f64") => (f64b(x) / f64b(y)).to_bits(),
                            ("min", "f64") => fmin(f64b(x), f64b(y), f64::is_nan, true).to_bits(),
                            ("max", "f64") => fmin(f64b(x), f64b(y), f64::is_nan, false).to_bits(),
                            ("add", _) => x.wrapping_add(y),
                            ("mul", _) => x.wrapping_mul(y),
                            ("min" | "max", t) if t.starts_with('s') => {
                                let (p, q) = (sx(x), sx(y));
                                (if (p < q) == (base == "min") { p } else { q }) as u64
                            }
                            ("min", _) => mask(x, bits).min(mask(y, bits)),
                            ("max", _) => mask(x, bits).max(mask(y, bits)),
                            ("div", t) if t.starts_with('s') => (sx(x) / sx(y)) as u64,
                            ("div", _) => mask(x, bits) / mask(y, bits),
                            other => panic!("{other:?}"),
                        };
                        mask(res, bits)
                    }
                    other => panic!("opcode {other}"),
                };
                regs.insert(a[0].clone(), r);
            }
        }
    }
}

fn dt_of(t: ElemType) -> DataType {
    match t {
        ElemType::I8 => DataType::I8,
        ElemType::U8 => DataType::U8,
        ElemType::I32 => DataType::I32,
        ElemType::U32 => DataType::U32,
        ElemType::I64 => DataType::I64,
        ElemType::U64 => DataType::U64,
        ElemType::F16 => DataType::F16,
        ElemType::Bf16 => DataType::Bf16,
        ElemType::F32 => DataType::F32,
        ElemType::F64 => DataType::F64,
    }
}

/// Element bytes with finite values for floats (NaN bit patterns are not compared), small-ish
/// magnitudes so products stay finite, both signs, integers anywhere.
fn data(t: ElemType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s >> 11
    };
    let mut out = Vec::with_capacity(n * t.size());
    for _ in 0..n {
        let r = next();
        let signed = (r % 2001) as f64 / 16.0 - 62.5;
        match t {
            ElemType::F32 => out.extend_from_slice(&(signed as f32).to_ne_bytes()),
            ElemType::F64 => out.extend_from_slice(&(signed / 3.0).to_ne_bytes()),
            ElemType::F16 => {
                out.extend_from_slice(&half::f16::from_f64(signed / 7.0).to_ne_bytes())
            }
            ElemType::Bf16 => {
                out.extend_from_slice(&half::bf16::from_f64(signed / 7.0).to_ne_bytes())
            }
            _ => out.extend_from_slice(&r.to_ne_bytes()[..t.size()]),
        }
    }
    out
}

const BASE: u64 = 0x7f00_0000_0000;

#[test]
fn modules_validate() {
    let reduce = parse_module(REDUCE_PTX);
    assert_eq!(reduce.len(), 50);
    for t in ElemType::ALL {
        for op in ReduceOp::ALL {
            assert!(reduce.contains_key(&reduce_kernel_name(op, t)));
        }
        assert!(reduce.contains_key(&divide_kernel_name(t)));
    }
    assert_eq!(parse_module(ATOMICS_PTX).len(), 2);
    assert!(!REDUCE_PTX.contains('\0') && !ATOMICS_PTX.contains('\0'));
}

#[test]
fn committed_ptx_is_the_generator_output() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../gpu-p2p/ptx");
    let out = std::process::Command::new("python3")
        .arg(format!("{dir}/gen_reduce.py"))
        .arg("--check")
        .arg(format!("{dir}/reduce.ptx"))
        .output()
        .expect("python3 runs (CI installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_reduction_kernel_matches_the_host_kernel() {
    let module = parse_module(REDUCE_PTX);
    let n = 1000; // not a multiple of the simulated grid: the loop's tail is exercised
    for t in ElemType::ALL {
        for op in ReduceOp::ALL {
            let es = t.size();
            let (x, y) = (data(t, n, 1), data(t, n, 2));
            // memory: dst | x | y, each at an offset that keeps natural alignment
            let mut mem = Mem {
                base: BASE,
                bytes: [vec![0x5a; n * es], x.clone(), y.clone()].concat(),
            };
            let (dst_a, x_a, y_a) = (BASE, BASE + (n * es) as u64, BASE + (2 * n * es) as u64);
            run(
                &module[&reduce_kernel_name(op, t)],
                &[dst_a, x_a, y_a, n as u64],
                3,
                32,
                &mut mem,
            );
            let red = match op {
                ReduceOp::Sum => RedOp::Sum,
                ReduceOp::Prod => RedOp::Prod,
                ReduceOp::Min => RedOp::Min,
                ReduceOp::Max => RedOp::Max,
            };
            let mut want = vec![0u8; n * es];
            reduce_copy(dt_of(t), red, &mut want, &x, &y).unwrap();
            assert!(
                mem.bytes[..n * es] == want[..],
                "reduce_{op}_{} differs from the host kernel",
                t.name()
            );
            assert_eq!(&mem.bytes[n * es..2 * n * es], &x[..], "x untouched");
        }
    }
}

#[test]
fn every_divide_kernel_matches_the_host_avg() {
    let module = parse_module(REDUCE_PTX);
    let n = 777;
    for t in ElemType::ALL {
        for nranks in [2u32, 3, 7] {
            let x = data(t, n, u64::from(nranks));
            let mut mem = Mem {
                base: BASE,
                bytes: x.clone(),
            };
            run(
                &module[&divide_kernel_name(t)],
                &[BASE, n as u64, u64::from(nranks)],
                2,
                64,
                &mut mem,
            );
            let mut want = x.clone();
            divide_in_place(dt_of(t), &mut want, nranks).unwrap();
            assert!(
                mem.bytes == want,
                "div_{} by {nranks} differs from the host avg",
                t.name()
            );
        }
    }
}

#[test]
fn atomics_kernels_follow_ibta_semantics() {
    let module = parse_module(ATOMICS_PTX);
    let mut mem = Mem {
        base: BASE,
        bytes: vec![0; 16],
    };
    mem.store(BASE, 8, 5);
    run(
        &module["atomic_cas_u64"],
        &[BASE, 4, 9, BASE + 8],
        1,
        1,
        &mut mem,
    );
    assert_eq!(
        (mem.load(BASE, 8), mem.load(BASE + 8, 8)),
        (5, 5),
        "no swap when compare differs"
    );
    run(
        &module["atomic_cas_u64"],
        &[BASE, 5, 9, BASE + 8],
        1,
        1,
        &mut mem,
    );
    assert_eq!((mem.load(BASE, 8), mem.load(BASE + 8, 8)), (9, 5));
    run(
        &module["atomic_add_u64"],
        &[BASE, u64::MAX, BASE + 8],
        1,
        1,
        &mut mem,
    );
    assert_eq!(
        (mem.load(BASE, 8), mem.load(BASE + 8, 8)),
        (8, 9),
        "fetch-add wraps"
    );
}

#[test]
fn the_validator_rejects_broken_ptx() {
    let good = REDUCE_PTX;
    let cases = [
        ("add.u64 %rd9, %rd3, %rd7;", "add.u64 %rd99, %rd3, %rd7;"), // beyond its declaration
        ("add.rn.f32 %f3", "add.s32 %f3"), // float register in an integer add
        ("bra.uni L_reduce_sum_i8_loop;", "bra.uni NOWHERE;"), // undefined label
        (
            "ld.param.u64 %rd1, [p_dst];",
            "ld.param.u64 %rd1, [p_none];",
        ),
    ];
    for (from, to) in cases {
        assert!(good.contains(from), "{from}");
        let bad = good.replacen(from, to, 1);
        let r = std::panic::catch_unwind(|| parse_module(&bad));
        assert!(r.is_err(), "validator accepted {to}");
    }
}
