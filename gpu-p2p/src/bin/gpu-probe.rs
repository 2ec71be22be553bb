//! `gpu-probe`: the non-collective GPU checks of `tests/gpu/check.sh`.
//!
//! ```text
//! gpu-probe devices              devices, attributes and the topology matrix (NVML or sysfs)
//! gpu-probe register [MiB]       device buffer as RDMA registration needs it: SYNC_MEMOPS set and
//!                                read back, IPC handle, dma-buf export, staged round trip checked
//! gpu-probe bandwidth [MiB]      host<->device: staged pipeline (pageable bytes, 2 pinned slots)
//!                                against a plain pinned cuMemcpyAsync, plain pageable cuMemcpy,
//!                                and device-to-device; best of 5, GB/s = 1e9 bytes/s
//! gpu-probe ipc [MiB]            CUDA IPC between processes, as the peer-to-peer all-reduce uses
//!                                it: a child process maps this one's buffer (cuIpcOpenMemHandle),
//!                                checks its bytes, writes new ones, which the parent checks
//! gpu-probe kernels              every reduction kernel of ptx/reduce.ptx (10 types x sum, prod,
//!                                min, max, and the avg division) JIT-compiled and run on
//!                                1,100,003 elements (more than one grid-stride pass), checked
//!                                against a host reference; prints the JIT time
//! ```
//! Exit status 0 only when every step succeeded and every data check matched (and for `--help` /
//! `-h`, which print the help on stdout), 2 for a usage error (checked before CUDA is loaded), 1
//! otherwise; errors print one line.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpu_p2p::cuda::{topology, CudaDevice, ElemType, ReduceOp};
use gpu_p2p::staging::Staged;
use gpu_p2p::{Cuda, CudaError, IpcMemHandle, Memory};

const REPS: usize = 5;
const WAIT: Duration = Duration::from_secs(60);

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(167).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn devices(cuda: &Cuda) -> Result<(), String> {
    let n = cuda.device_count().map_err(s)?;
    println!(
        "driver CUDA version {}, {n} device(s)",
        cuda.driver_version().map_err(s)?
    );
    let mut ids = Vec::new();
    for i in 0..n {
        let d = cuda.device(i).map_err(s)?;
        let info = d.info().map_err(s)?;
        println!(
            "GPU {i}: {} ({}), compute {}.{}, {} SMs, {:.1} GiB, GPUDirect RDMA {}, dma-buf {}",
            info.name,
            info.pci_bus_id,
            info.compute_capability.0,
            info.compute_capability.1,
            info.multiprocessors,
            info.total_memory as f64 / (1u64 << 30) as f64,
            yes(info.gpudirect_rdma),
            yes(info.dmabuf)
        );
        ids.push(info.pci_bus_id);
    }
    println!("{}", topology::report(&ids));
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let (a, b) = (cuda.device(i).map_err(s)?, cuda.device(j).map_err(s)?);
                println!(
                    "peer access GPU {i} -> GPU {j}: {}",
                    yes(a.can_access_peer(&b).map_err(s)?)
                );
            }
        }
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn register(dev: &Arc<CudaDevice>, bytes: usize) -> Result<(), String> {
    let mem = Arc::new(dev.alloc(bytes).map_err(s)?);
    mem.set_sync_memops().map_err(s)?;
    println!(
        "registered {bytes} bytes at {:#x} on GPU {}: SYNC_MEMOPS set and read back",
        mem.device_ptr(),
        mem.pointer_device_ordinal().map_err(s)?
    );
    let h = mem.ipc_handle().map_err(s)?;
    println!("IPC handle: {:02x?}...", &h.0[..8]);
    let dmabuf = match mem.export_dmabuf(0, bytes) {
        Ok(fd) => {
            println!("dma-buf export (ibv_reg_dmabuf_mr input): fd {fd:?}");
            Ok(())
        }
        // No dma-buf on this system (proprietary kernel module, old kernel): a fact to report,
        // not a failure of this code; ibv_reg_dmabuf_mr is then unavailable and the verbs backend
        // cannot register GPU memory.
        Err(e @ CudaError::Unsupported { .. }) => {
            println!("dma-buf export: not available here ({e})");
            Ok(())
        }
        Err(e) => Err(format!("dma-buf export: {e}")),
    };
    // The software engine's path: a staged round trip through two pinned slots.
    let staged = Staged::cuda(mem.clone()).map_err(s)?;
    let data = pattern(bytes, 3);
    staged.write(0, &data).map_err(s)?;
    let mut back = vec![0u8; bytes];
    mem.copy_to_host(0, &mut back).map_err(s)?;
    if back != data {
        return Err("staged upload: device bytes differ from the source".into());
    }
    mem.fetch_add(8, 5).map_err(s)?;
    let mut again = vec![0u8; bytes];
    staged.read(0, &mut again).map_err(s)?;
    let word = u64::from_ne_bytes(again[8..16].try_into().unwrap_or_default());
    let want = u64::from_ne_bytes(data[8..16].try_into().unwrap_or_default()).wrapping_add(5);
    if word != want || again[16..] != data[16..] || again[..8] != data[..8] {
        return Err("staged download or the GPU fetch-and-add: bytes differ".into());
    }
    let old = mem.compare_swap(8, want, 1).map_err(s)?;
    if old != want || mem.compare_swap(8, 1, 2).map_err(s)? != 1 {
        return Err("GPU compare-and-swap returned the wrong value".into());
    }
    println!("staged round trip of {bytes} bytes and GPU atomics: data OK");
    dmabuf
}

fn best(mut f: impl FnMut() -> Result<f64, String>) -> Result<f64, String> {
    f()?; // warm-up
    let mut t = f64::INFINITY;
    for _ in 0..REPS {
        t = t.min(f()?);
    }
    Ok(t)
}

fn bandwidth(dev: &Arc<CudaDevice>, bytes: usize) -> Result<(), String> {
    let mem = Arc::new(dev.alloc(bytes).map_err(s)?);
    let other = dev.alloc(bytes).map_err(s)?;
    let pinned = dev.alloc_pinned(bytes).map_err(s)?;
    let stream = dev.stream().map_err(s)?;
    let (start, end) = (dev.event(true).map_err(s)?, dev.event(true).map_err(s)?);
    let gbs = |secs: f64| bytes as f64 / secs / 1e9;
    let timed = |f: &dyn Fn() -> Result<(), CudaError>| -> Result<f64, String> {
        start.record(&stream).map_err(s)?;
        f().map_err(s)?;
        end.record(&stream).map_err(s)?;
        end.wait(WAIT).map_err(s)?;
        Ok(f64::from(end.elapsed_ms(&start).map_err(s)?) / 1e3)
    };
    let pin_h2d = best(|| timed(&|| stream.copy_from_pinned(&mem, 0, &pinned, 0, bytes)))?;
    let pin_d2h = best(|| timed(&|| stream.copy_to_pinned(&pinned, 0, &mem, 0, bytes)))?;
    let d2d = best(|| timed(&|| stream.copy_device(&other, 0, &mem, 0, bytes)))?;
    let staged = Staged::cuda(mem.clone()).map_err(s)?;
    let src = pattern(bytes, 9);
    let mut dst = vec![0u8; bytes];
    let wall = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let t = Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let st_h2d = best(|| wall(&mut || staged.upload(0, &src).map_err(s)))?;
    let st_d2h = best(|| wall(&mut || staged.download(0, &mut dst).map_err(s)))?;
    if dst != src {
        return Err("staged bandwidth run: downloaded bytes differ from the uploaded ones".into());
    }
    let pg_h2d = best(|| wall(&mut || mem.copy_from_host(0, &src).map_err(s)))?;
    let pg_d2h = best(|| wall(&mut || mem.copy_to_host(0, &mut dst).map_err(s)))?;
    println!("host<->device bandwidth, {bytes} bytes, GB/s (best of {REPS}):");
    println!("  {:<44} {:>8} {:>8}", "", "H2D", "D2H");
    println!(
        "  {:<44} {:>8.2} {:>8.2}",
        "plain pinned cuMemcpyAsync (baseline)",
        gbs(pin_h2d),
        gbs(pin_d2h)
    );
    println!(
        "  {:<44} {:>8.2} {:>8.2}",
        "staged pipeline (pageable src, 2 x 1 MiB pinned)",
        gbs(st_h2d),
        gbs(st_d2h)
    );
    println!(
        "  {:<44} {:>8.2} {:>8.2}",
        "plain pageable cuMemcpy",
        gbs(pg_h2d),
        gbs(pg_d2h)
    );
    println!(
        "  staged / pinned: H2D {:.2}, D2H {:.2}",
        pin_h2d / st_h2d,
        pin_d2h / st_d2h
    );
    println!("device-to-device cuMemcpyDtoDAsync: {:.2} GB/s", gbs(d2d));
    Ok(())
}

/// Bound on the child process of `ipc` (it loads the driver and maps one buffer).
const CHILD_WAIT: Duration = Duration::from_secs(60);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(text: &str) -> Result<[u8; IpcMemHandle::LEN], String> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * IpcMemHandle::LEN {
        return Err(format!(
            "an IPC handle is {} hex digits",
            2 * IpcMemHandle::LEN
        ));
    }
    let mut out = [0u8; IpcMemHandle::LEN];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let t = std::str::from_utf8(pair).map_err(s)?;
        out[i] = u8::from_str_radix(t, 16).map_err(s)?;
    }
    Ok(out)
}

fn ipc(dev: &Arc<CudaDevice>, bytes: usize) -> Result<(), String> {
    let mem = dev.alloc(bytes).map_err(s)?;
    mem.copy_from_host(0, &pattern(bytes, 5)).map_err(s)?;
    let h = mem.ipc_handle().map_err(s)?;
    let exe = std::env::current_exe().map_err(s)?;
    let t = Instant::now();
    let mut child = std::process::Command::new(exe)
        .args(["ipc-child", &hex(&h.0), &bytes.to_string()])
        .spawn()
        .map_err(|e| format!("starting the child process: {e}"))?;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(s)? {
            break st;
        }
        if t.elapsed() > CHILD_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the IPC child did not finish within {} s",
                CHILD_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        return Err(format!("the IPC child failed ({status})"));
    }
    let mut back = vec![0u8; bytes];
    mem.copy_to_host(0, &mut back).map_err(s)?;
    if back != pattern(bytes, 6) {
        return Err("the child's writes through its IPC mapping are not in the buffer".into());
    }
    println!(
        "CUDA IPC of {bytes} bytes between processes: child mapped, read and wrote them, data OK ({:.2} s with the child's driver start)",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn ipc_child(dev: &Arc<CudaDevice>, handle: &str, bytes: &str) -> Result<(), String> {
    let h = IpcMemHandle(unhex(handle)?);
    let bytes: usize = bytes.parse().map_err(s)?;
    let m = dev.open_ipc(&h, bytes).map_err(s)?;
    let mut got = vec![0u8; bytes];
    m.copy_to_host(0, &mut got).map_err(s)?;
    if got != pattern(bytes, 5) {
        return Err("ipc-child: the mapped bytes differ from the parent's".into());
    }
    m.copy_from_host(0, &pattern(bytes, 6)).map_err(s)?;
    Ok(())
}

/// Kernel test data: integers anywhere in their range; floats small integers in -8..=8, so every
/// sum, product, min, max and quarter is exact in every float type and the check is bitwise.
fn kernel_data(ty: ElemType, n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n * ty.size());
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let small = (x % 17) as i32 - 8;
        match ty {
            ElemType::F32 | ElemType::F64 | ElemType::F16 | ElemType::Bf16 => {
                out.extend_from_slice(&encode_float(ty, f64::from(small)))
            }
            _ => out.extend_from_slice(&x.to_ne_bytes()[..ty.size()]),
        }
    }
    out
}

/// `v` (exactly representable in `ty`) as the bytes of one `ty` element.
fn encode_float(ty: ElemType, v: f64) -> Vec<u8> {
    let b = (v as f32).to_bits();
    match ty {
        ElemType::F64 => v.to_ne_bytes().to_vec(),
        ElemType::F32 => (v as f32).to_ne_bytes().to_vec(),
        ElemType::Bf16 => ((b >> 16) as u16).to_ne_bytes().to_vec(),
        _ => {
            // f16 of a normal f32 with at most 10 mantissa bits: rebias the exponent.
            let sign = ((b >> 16) & 0x8000) as u16;
            let h = if v == 0.0 {
                sign
            } else {
                let exp = (((b >> 23) & 0xff) as i32 - 127 + 15) as u16;
                sign | (exp << 10) | ((b >> 13) & 0x3ff) as u16
            };
            h.to_ne_bytes().to_vec()
        }
    }
}

fn decode_float(ty: ElemType, b: &[u8]) -> f64 {
    match ty {
        ElemType::F64 => f64::from_ne_bytes(b.try_into().unwrap_or_default()),
        ElemType::F32 => f64::from(f32::from_ne_bytes(b.try_into().unwrap_or_default())),
        ElemType::Bf16 => {
            let h = u16::from_ne_bytes(b.try_into().unwrap_or_default());
            f64::from(f32::from_bits(u32::from(h) << 16))
        }
        _ => {
            let h = u16::from_ne_bytes(b.try_into().unwrap_or_default());
            let (sign, exp, mant) = ((h >> 15) & 1, (h >> 10) & 0x1f, h & 0x3ff);
            if exp == 0 && mant == 0 {
                return if sign == 1 { -0.0 } else { 0.0 };
            }
            let f = f32::from_bits(
                (u32::from(sign) << 31)
                    | ((u32::from(exp) + 127 - 15) << 23)
                    | (u32::from(mant) << 13),
            );
            f64::from(f)
        }
    }
}

/// The host reference of `reduce_<op>_<ty>` (integers wrap) and, with `div`, of `div_<ty>`.
fn reference(ty: ElemType, op: Option<ReduceOp>, x: &[u8], y: &[u8], div: u32) -> Vec<u8> {
    macro_rules! ints {
        ($($e:ident => $t:ty),*) => {
            match ty {
                $(ElemType::$e => {
                    const W: usize = core::mem::size_of::<$t>();
                    let get = |c: &[u8]| <$t>::from_ne_bytes(c.try_into().unwrap_or_default());
                    return x.chunks_exact(W).zip(y.chunks_exact(W)).flat_map(|(a, b)| {
                        let (a, b) = (get(a), get(b));
                        let r = match op {
                            Some(ReduceOp::Sum) => a.wrapping_add(b),
                            Some(ReduceOp::Prod) => a.wrapping_mul(b),
                            Some(ReduceOp::Min) => a.min(b),
                            Some(ReduceOp::Max) => a.max(b),
                            // Truncates toward zero, as PTX div.s/div.u.
                            None => a / (div as $t),
                        };
                        r.to_ne_bytes()
                    }).collect();
                })*
                _ => {}
            }
        };
    }
    ints!(I8 => i8, U8 => u8, I32 => i32, U32 => u32, I64 => i64, U64 => u64);
    let w = ty.size();
    x.chunks_exact(w)
        .zip(y.chunks_exact(w))
        .flat_map(|(a, b)| {
            let (a, b) = (decode_float(ty, a), decode_float(ty, b));
            let r = match op {
                Some(ReduceOp::Sum) => a + b,
                Some(ReduceOp::Prod) => a * b,
                Some(ReduceOp::Min) => a.min(b),
                Some(ReduceOp::Max) => a.max(b),
                None => a / f64::from(div),
            };
            encode_float(ty, r)
        })
        .collect()
}

fn kernels(dev: &Arc<CudaDevice>) -> Result<(), String> {
    const N: usize = 1_100_003; // more than 4096 blocks x 256 threads: the grid-stride loop runs twice
    let t = Instant::now();
    let k = dev.kernels().map_err(s)?;
    println!(
        "PTX modules JIT-compiled and loaded in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let stream = dev.stream().map_err(s)?;
    let mut wrong = Vec::new();
    let mut checked = 0;
    for ty in ElemType::ALL {
        let bytes = N * ty.size();
        let (xs, ys) = (kernel_data(ty, N, 1), kernel_data(ty, N, 2));
        let (x, y, d) = (
            dev.alloc(bytes).map_err(s)?,
            dev.alloc(bytes).map_err(s)?,
            dev.alloc(bytes).map_err(s)?,
        );
        x.copy_from_host(0, &xs).map_err(s)?;
        y.copy_from_host(0, &ys).map_err(s)?;
        let mut got = vec![0u8; bytes];
        for op in ReduceOp::ALL {
            d.fill(0, bytes, 0x5a).map_err(s)?;
            k.reduce(&stream, op, ty, (&d, 0), (&x, 0), (&y, 0), N)
                .map_err(s)?;
            stream.synchronize().map_err(s)?;
            d.copy_to_host(0, &mut got).map_err(s)?;
            checked += 1;
            if got != reference(ty, Some(op), &xs, &ys, 0) {
                wrong.push(format!("reduce_{}_{}", op.name(), ty.name()));
            }
        }
        let div = if matches!(
            ty,
            ElemType::F16 | ElemType::Bf16 | ElemType::F32 | ElemType::F64
        ) {
            4
        } else {
            3
        };
        k.divide(&stream, ty, (&x, 0), N, div).map_err(s)?;
        stream.synchronize().map_err(s)?;
        x.copy_to_host(0, &mut got).map_err(s)?;
        checked += 1;
        if got != reference(ty, None, &xs, &xs, div) {
            wrong.push(format!("div_{}", ty.name()));
        }
    }
    if wrong.is_empty() {
        println!("{checked} reduction kernels on {N} elements each: data OK");
        Ok(())
    } else {
        Err(format!(
            "{} of {checked} kernels computed wrong bytes: {}",
            wrong.len(),
            wrong.join(", ")
        ))
    }
}

/// The non-collective GPU checks of `tests/gpu/check.sh`.
///
/// Exit status 0 only when every step succeeded and every data check matched, 2 for a usage
/// error (checked before CUDA is loaded), 1 otherwise; errors print one line.
#[derive(Parser, Debug)]
#[command(name = "gpu-probe", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Devices, attributes and the topology matrix (NVML or sysfs).
    Devices,
    /// A device buffer as RDMA registration needs it: SYNC_MEMOPS set and read back, IPC
    /// handle, dma-buf export, staged round trip checked.
    Register {
        /// Buffer size, MiB (default 64).
        #[arg(value_name = "MiB", value_parser = parse_mib)]
        mib: Option<usize>,
    },
    /// Host<->device: staged pipeline (pageable bytes, 2 pinned slots) against a plain pinned
    /// cuMemcpyAsync, plain pageable cuMemcpy, and device-to-device; best of 5, GB/s = 1e9
    /// bytes/s.
    Bandwidth {
        /// Buffer size, MiB (default 256).
        #[arg(value_name = "MiB", value_parser = parse_mib)]
        mib: Option<usize>,
    },
    /// CUDA IPC between processes, as the peer-to-peer all-reduce uses it: a child process maps
    /// this one's buffer (cuIpcOpenMemHandle), checks its bytes, writes new ones, which the
    /// parent checks.
    Ipc {
        /// Buffer size, MiB (default 16).
        #[arg(value_name = "MiB", value_parser = parse_mib)]
        mib: Option<usize>,
    },
    /// Every reduction kernel of ptx/reduce.ptx (10 types x sum, prod, min, max, and the avg
    /// division) JIT-compiled and run on 1,100,003 elements, checked against a host reference.
    Kernels,
    /// The child process of `ipc` (internal).
    #[command(hide = true)]
    IpcChild {
        /// The parent's IPC handle, hexadecimal.
        handle: String,
        /// Bytes of the buffer.
        bytes: String,
    },
}

/// A positive number of MiB that fits in memory, as bytes.
fn parse_mib(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|&m| m > 0)
        .and_then(|m| m.checked_mul(1 << 20))
        .ok_or_else(|| format!("'{text}' is not a positive number of MiB that fits in memory"))
}

fn main() -> ExitCode {
    // The command line first (clap exits with 2 on a usage error, 0 for --help): a typo is a
    // usage error on any machine, GPU or not.
    let cli = Cli::parse();
    let r = (|| {
        let cuda = Cuda::load().map_err(s)?;
        let dev = || cuda.device(0).map_err(s);
        match &cli.cmd {
            Cmd::Devices => devices(&cuda),
            Cmd::Register { mib } => register(&dev()?, mib.unwrap_or(64 << 20)),
            Cmd::Bandwidth { mib } => bandwidth(&dev()?, mib.unwrap_or(256 << 20)),
            Cmd::Ipc { mib } => ipc(&dev()?, mib.unwrap_or(16 << 20)),
            Cmd::IpcChild { handle, bytes } => ipc_child(&dev()?, handle, bytes),
            Cmd::Kernels => kernels(&dev()?),
        }
    })();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_encodings_are_ieee_and_round_trip_the_test_values() {
        let h = |v: f64| u16::from_ne_bytes(encode_float(ElemType::F16, v).try_into().unwrap());
        let b = |v: f64| u16::from_ne_bytes(encode_float(ElemType::Bf16, v).try_into().unwrap());
        assert_eq!(
            (h(1.0), h(-2.0), h(0.25), h(64.0), h(-0.0)),
            (0x3c00, 0xc000, 0x3400, 0x5400, 0x8000)
        );
        assert_eq!((b(1.0), b(-2.0), b(0.0)), (0x3f80, 0xc000, 0x0000));
        for ty in [ElemType::F16, ElemType::Bf16, ElemType::F32, ElemType::F64] {
            for k in -64..=64 {
                for v in [f64::from(k), f64::from(k) / 4.0] {
                    assert_eq!(decode_float(ty, &encode_float(ty, v)), v, "{ty:?} {v}");
                }
            }
        }
    }

    #[test]
    fn the_reference_wraps_truncates_and_matches_the_data_contract() {
        let x = [100i8 as u8, (-7i8) as u8];
        let y = [100i8 as u8, 3];
        assert_eq!(
            reference(ElemType::I8, Some(ReduceOp::Sum), &x, &y, 0),
            vec![200u8, (-4i8) as u8]
        );
        assert_eq!(
            reference(ElemType::I8, None, &x, &x, 3),
            vec![33u8, (-2i8) as u8]
        );
        let f = kernel_data(ElemType::F16, 1000, 1);
        for c in f.chunks_exact(2) {
            let v = decode_float(ElemType::F16, c);
            assert!(v.fract() == 0.0 && (-8.0..=8.0).contains(&v));
        }
        assert_eq!(
            unhex(&hex(&[0xab; IpcMemHandle::LEN])).unwrap(),
            [0xab; IpcMemHandle::LEN]
        );
        assert!(unhex("zz").is_err());
    }
}
