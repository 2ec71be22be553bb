//! `gpu-probe`: the non-collective GPU checks of `tests/gpu/check.sh`.
//!
//! ```text
//! gpu-probe devices              devices, attributes and the topology matrix (NVML or sysfs)
//! gpu-probe register [MiB]       device buffer as RDMA registration needs it: SYNC_MEMOPS set and
//!                                read back, IPC handle, dma-buf export, staged round trip checked
//! gpu-probe bandwidth [MiB]      host<->device: staged pipeline (pageable bytes, 2 pinned slots)
//!                                against a plain pinned cuMemcpyAsync, plain pageable cuMemcpy,
//!                                and device-to-device; best of 5, GB/s = 1e9 bytes/s
//! ```
//! Exit status 0 only when every step succeeded and every data check matched; errors print one line.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_p2p::cuda::{topology, CudaDevice};
use gpu_p2p::staging::Staged;
use gpu_p2p::{Cuda, CudaError, Memory};

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib = |i: usize, default: usize| -> Result<usize, String> {
        match args.get(i) {
            None => Ok(default << 20),
            Some(a) => a
                .parse::<usize>()
                .ok()
                .filter(|&m| m > 0)
                .map(|m| m << 20)
                .ok_or_else(|| format!("'{a}' is not a positive number of MiB")),
        }
    };
    let r = (|| {
        let cuda = Cuda::load().map_err(s)?;
        let dev = || cuda.device(0).map_err(s);
        match args.first().map(String::as_str) {
            Some("devices") => devices(&cuda),
            Some("register") => register(&dev()?, mib(1, 64)?),
            Some("bandwidth") => bandwidth(&dev()?, mib(1, 256)?),
            _ => Err("usage: gpu-probe devices | register [MiB] | bandwidth [MiB]".into()),
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
