//! DCQCN's reaction point: the per-QP rate limiter a RoCE NIC runs when CNPs come back.
//!
//! The algorithm is the one of Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments" (SIGCOMM 2015, §3.1 "RP algorithm", after QCN, IEEE 802.1Qau), with the
//! parameter names ConnectX NICs expose (mlx5 `/sys/class/net/*/ecn/roce_rp/*`, NVIDIA "DCQCN
//! parameters"). Per QP it keeps a current rate `RC`, a target rate `RT` and the congestion
//! estimate `alpha`:
//!
//! * **CNP** (rate decrease): `RT = RC`, `RC = RC * (1 - alpha / 2)`, then
//!   `alpha = (1 - g) * alpha + g`; the rate-increase timer and byte counter restart. The first
//!   CNP of an unlimited QP sets `alpha` to `initial_alpha_value` first (the paper starts from
//!   `alpha = 1`: the first CNP halves the rate), or sets both rates to
//!   `rate_to_set_on_first_cnp` when that is not zero.
//! * **alpha timer**: every `dce_tcp_rtt` (the paper's `K`, 55 us) without a CNP,
//!   `alpha = (1 - g) * alpha`.
//! * **rate increase**: an event each time the timer (`rpg_time_reset`, the paper's `T`) expires
//!   and each time the QP has sent `rpg_byte_reset` bytes (the paper's `B`); `T` and `BC` count
//!   them since the last CNP. With `F = rpg_threshold`: while `max(T, BC) < F` *fast recovery*
//!   (`RT` stays); once `min(T, BC) > F` *hyper increase* (`RT += i * rpg_hai_rate`,
//!   `i = min(T, BC) - F`); otherwise *additive increase* (`RT += rpg_ai_rate`). Then
//!   `RC = (RT + RC) / 2` (rounded up, so that it reaches `RT`).
//! * `RC` never falls below `rpg_min_rate`, nor below `rpg_min_dec_fac` percent of itself in one
//!   cut; `RT` never exceeds `rpg_max_rate`. When `RC` is back at `rpg_max_rate` the limiter is
//!   removed (the QP is unlimited, its timers stop), as a NIC frees its rate limiter.
//!
//! `g` is `(1024 - dce_tcp_g) / 1024` (mlx5 fixed point: 1019 by default; the paper's 1/256 is
//! 1020) and the cut is `alpha / 2^(rpg_gd - 10)` (mlx5 `rpg_gd` = 11 is the paper's `alpha / 2`).
//! `alpha` is kept in fixed point with 20 fraction bits, rates in bit/s as integers, so runs
//! are exact and reproducible.
//!
//! Sans-I/O like the rest of the engine: [`ReactionPoint::on_cnp`], [`ReactionPoint::on_sent`]
//! and [`ReactionPoint::handle_timeout`] are its inputs; [`ReactionPoint::poll_timeout`] says
//! when its timers fire and [`ReactionPoint::next_send`] when the paced QP may send its next
//! packet (a packet of `L` wire bytes at rate `RC` holds the next one back by `8 L / RC`).

use core::time::Duration;

use super::time::Instant;

/// Fraction bits of `alpha`.
pub const ALPHA_SHIFT: u32 = 20;
/// `alpha = 1.0`.
pub const ALPHA_ONE: u64 = 1 << ALPHA_SHIFT;

/// Most timer periods caught up in one [`ReactionPoint::handle_timeout`] (a driver that woke very
/// late): beyond it the timers restart from `now`.
const MAX_CATCH_UP: u32 = 4096;

/// Bytes a packet occupies on an Ethernet link besides its UDP payload: UDP (8), IPv4 (20) or
/// IPv6 (40), Ethernet header (14) and FCS (4), preamble and start delimiter (8), inter-frame
/// gap (12) (IEEE 802.3 clause 4.4.2). What a line-rate link spends on one RoCEv2 packet.
pub const fn wire_bytes(udp_payload_len: usize, ipv6: bool) -> u64 {
    let ip = if ipv6 { 40 } else { 20 };
    (udp_payload_len + 8 + ip + 14 + 4 + 8 + 12) as u64
}

/// The reaction point's parameters (per device in [`super::EngineConfig::dcqcn`], per QP with
/// [`super::SoftHca::set_qp_dcqcn`]). Rates in bit/s, times as [`Duration`]s, sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcqcnParams {
    /// The ceiling of `RT` and the rate of an unlimited QP: the line rate (mlx5
    /// `rpg_max_rate`, 0 there meaning the port's speed), bit/s.
    pub rpg_max_rate: u64,
    /// The floor of `RC` (mlx5 `rpg_min_rate`, 1 Mb/s), bit/s.
    pub rpg_min_rate: u64,
    /// Additive increase step of `RT`, `R_AI` (paper 40 Mb/s; mlx5 `rpg_ai_rate` 5 Mb/s), bit/s.
    pub rpg_ai_rate: u64,
    /// Hyper increase step of `RT`, `R_HAI` (mlx5 `rpg_hai_rate` 50 Mb/s), bit/s.
    pub rpg_hai_rate: u64,
    /// Rate-increase timer period `T` (paper 55 us; mlx5 `rpg_time_reset` 300 us).
    pub rpg_time_reset: Duration,
    /// Rate-increase byte counter `B` (paper 10 MB; mlx5 `rpg_byte_reset` 32767), bytes; at
    /// least 1 (0 is taken as 1).
    pub rpg_byte_reset: u64,
    /// Increase events before additive increase, `F` (paper and QCN 5; mlx5 `rpg_threshold` 1).
    pub rpg_threshold: u32,
    /// `log2` of the divisor of `alpha` in the cut, in mlx5's fixed point: the cut is
    /// `alpha / 2^(rpg_gd - 10)`; 11 (default) is the paper's `alpha / 2`. 10..=20.
    pub rpg_gd: u32,
    /// The most one cut may take, as the percentage of `RC` that remains at least (mlx5
    /// `rpg_min_dec_fac`, 50).
    pub rpg_min_dec_fac: u32,
    /// `alpha` gain as `1024 - 1024 g` (mlx5 `dce_tcp_g`, 1019; the paper's `g = 1/256` is
    /// 1020). 0..=1023.
    pub dce_tcp_g: u32,
    /// The alpha timer period `K` (paper 55 us; mlx5 `dce_tcp_rtt` 1 us).
    pub dce_tcp_rtt: Duration,
    /// `alpha` at the first CNP of an unlimited QP, in 1/1024 (mlx5 `initial_alpha_value` 1023;
    /// the paper's 1.0 is 1024). 0..=1024.
    pub initial_alpha_value: u32,
    /// `RC` and `RT` set by the first CNP of an unlimited QP instead of the cut; 0 (default):
    /// cut as on any CNP (mlx5 `rate_to_set_on_first_cnp`), bit/s.
    pub rate_to_set_on_first_cnp: u64,
    /// Shortest time between two rate cuts: a CNP sooner after the last cut is counted and
    /// ignored (mlx5 `rate_reduce_monitor_period`, 4 us; the paper relies on the NP's CNP
    /// interval instead: zero).
    pub rate_reduce_monitor_period: Duration,
    /// Pace an unlimited QP at `rpg_max_rate` too (not a ConnectX parameter: a NIC's port
    /// sends at its line rate by itself). For links without a line rate of their own, such as a
    /// kernel UDP socket (`hca::link::udp`), where an unlimited requester would otherwise send
    /// its whole window at once: with it, `rpg_max_rate` is the link's line rate and holds every
    /// packet of `L` wire bytes back by `8 L / rpg_max_rate` before the first CNP and after a
    /// release. `false` in [`DcqcnParams::paper`] and [`DcqcnParams::mlx5`] (the in-memory
    /// fabric's NICs pace at their line rate themselves).
    pub pace_at_max_rate: bool,
    /// Burst allowance of the pacer, bytes (a token bucket's depth; not a ConnectX
    /// parameter): a packet sent late, or after the QP was idle, is taken to have left up to
    /// `8 x pace_burst / RC` before it did, so the packets after it may go back to back until
    /// that credit is spent. Over any interval `I` a paced QP then sends at most
    /// `RC x I / 8 + pace_burst` bytes plus one packet. For a driver that wakes late (a progress
    /// thread sleeping in poll(2), whose timeout has a resolution of a millisecond), it keeps
    /// the achieved rate at the configured one. 0 in [`DcqcnParams::paper`] and
    /// [`DcqcnParams::mlx5`]: every packet is spaced from the one before, idle time earns
    /// nothing.
    pub pace_burst: u64,
}

impl DcqcnParams {
    /// The parameters of the paper's experiments (Zhu et al. 2015, §5 and Table 1 as we read
    /// them: `g` = 1/256, `K` = 55 us, `T` = 55 us, `B` = 10 MB, `F` = 5, `R_AI` = 40 Mb/s;
    /// `R_HAI` = 10 `R_AI` as in QCN's defaults), `alpha` starting at 1, for a link of
    /// `line_rate` bit/s.
    pub const fn paper(line_rate: u64) -> DcqcnParams {
        DcqcnParams {
            rpg_max_rate: line_rate,
            rpg_min_rate: 1_000_000,
            rpg_ai_rate: 40_000_000,
            rpg_hai_rate: 400_000_000,
            rpg_time_reset: Duration::from_micros(55),
            rpg_byte_reset: 10_000_000,
            rpg_threshold: 5,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            dce_tcp_g: 1020,
            dce_tcp_rtt: Duration::from_micros(55),
            initial_alpha_value: 1024,
            rate_to_set_on_first_cnp: 0,
            rate_reduce_monitor_period: Duration::ZERO,
            pace_at_max_rate: false,
            pace_burst: 0,
        }
    }

    /// [`DcqcnParams::paper`] scaled in proportion to a link of `line_rate` bit/s: the paper's
    /// rates are for 40 Gb/s and its times for a datacenter's microsecond round trips, and kept as
    /// they are they would take a link of a few Mb/s (whose round trip through a queue lasts
    /// milliseconds) back to its line rate long before any feedback. With `s` = 40 Gb/s /
    /// `line_rate`: `R_AI` = `line_rate` / 1000 and `R_HAI` = `line_rate` / 100 (the paper's
    /// 40 and 400 Mb/s over 40 Gb/s), the timers `K` = `T` = 55 us x `s`, and CNPs within
    /// 50 us x `s` of the last cut ignored (`rate_reduce_monitor_period`: the paper's NP sends
    /// at most one CNP per 50 us, and the receiver's [`super::EngineConfig::cnp_interval`] is
    /// not scaled); `B` (10 MB), `g`, `F` and alpha stay, so the dynamics per byte are the
    /// paper's. `rpg_min_rate` is at most `line_rate` / 100 (not the proportional 1/40000:
    /// a rate that low would stall a QP for seconds per packet). At least 1 for every rate;
    /// `line_rate` 0 is taken as 1.
    pub const fn paper_scaled(line_rate: u64) -> DcqcnParams {
        let line = if line_rate == 0 { 1 } else { line_rate };
        let p = DcqcnParams::paper(line);
        let min = if line / 100 < p.rpg_min_rate {
            line / 100
        } else {
            p.rpg_min_rate
        };
        DcqcnParams {
            rpg_min_rate: nonzero(min),
            rpg_ai_rate: nonzero(line / 1000),
            rpg_hai_rate: nonzero(line / 100),
            rpg_time_reset: scaled(55_000, line),
            dce_tcp_rtt: scaled(55_000, line),
            rate_reduce_monitor_period: scaled(50_000, line),
            ..p
        }
    }

    /// The mlx5 (ConnectX-4 and later) defaults, for a port of `line_rate` bit/s.
    pub const fn mlx5(line_rate: u64) -> DcqcnParams {
        DcqcnParams {
            rpg_max_rate: line_rate,
            rpg_min_rate: 1_000_000,
            rpg_ai_rate: 5_000_000,
            rpg_hai_rate: 50_000_000,
            rpg_time_reset: Duration::from_micros(300),
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            dce_tcp_g: 1019,
            dce_tcp_rtt: Duration::from_micros(1),
            initial_alpha_value: 1023,
            rate_to_set_on_first_cnp: 0,
            rate_reduce_monitor_period: Duration::from_micros(4),
            pace_at_max_rate: false,
            pace_burst: 0,
        }
    }

    /// `g` in units of 2^-20.
    fn g(&self) -> u64 {
        u64::from(1024 - self.dce_tcp_g.min(1024)) << (ALPHA_SHIFT - 10)
    }
}

/// `nanos` at 40 Gb/s scaled to `line` bit/s (`nanos` x 40 Gb/s / `line`, in u128: no
/// overflow for any `line` >= 1 and the `nanos` used here).
const fn scaled(nanos: u64, line: u64) -> Duration {
    let n = (nanos as u128) * 40_000_000_000 / (line as u128);
    Duration::from_nanos(if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    })
}

const fn nonzero(v: u64) -> u64 {
    if v == 0 {
        1
    } else {
        v
    }
}

/// What a reaction point did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpStats {
    /// CNPs received.
    pub cnps: u64,
    /// Rate cuts (CNPs acted on).
    pub cuts: u64,
    /// CNPs ignored within `rate_reduce_monitor_period` of the last cut.
    pub cnps_ignored: u64,
    /// Rate-increase events by the timer.
    pub timer_increases: u64,
    /// Rate-increase events by the byte counter.
    pub byte_increases: u64,
    /// Times the limiter was removed (RC back at the line rate).
    pub releases: u64,
    /// Wire bytes ([`wire_bytes`]) of the requester packets the pacer spaced: every packet sent
    /// while limited, and while unlimited with [`DcqcnParams::pace_at_max_rate`].
    pub paced_bytes: u64,
    /// The most wire bytes of paced packets sent (by the driver's clock, `now` of
    /// [`ReactionPoint::on_sent`]) within one accounting window of `rpg_time_reset` (windows
    /// back to back from the first paced packet): what the pacer let through at its
    /// fastest, against `RC x rpg_time_reset / 8` configured (plus the packet that straddles a
    /// window's start). See [`ReactionPoint::paced_span`] for the rate over the whole run.
    pub paced_window_max: u64,
}

/// One QP's reaction point. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactionPoint {
    params: DcqcnParams,
    /// A rate limiter is in place (a CNP came and `RC` is not back at the line rate).
    limited: bool,
    rc: u64,
    rt: u64,
    alpha: u64,
    /// Timer events since the last CNP (`T`).
    t_count: u32,
    /// Byte-counter events since the last CNP (`BC`).
    bc_count: u32,
    /// Bytes sent since the last byte-counter event.
    bytes: u64,
    alpha_at: Option<Instant>,
    increase_at: Option<Instant>,
    last_cut: Option<Instant>,
    /// When the last paced packet started.
    last_tx: Instant,
    /// Its size in bits; 0: no packet holds the next one back.
    last_bits: u64,
    /// With a burst allowance: the last paced packet's pacing time plus its wire time at the
    /// `RC` then (the theoretical time of the next one).
    tat: Instant,
    /// The current accounting window's start and its paced bytes ([`RpStats::paced_window_max`]).
    window: Option<(Instant, u64)>,
    /// When the first and the last paced packet were sent, and the last one's wire bytes.
    span: Option<(Instant, Instant, u64)>,
    stats: RpStats,
}

impl ReactionPoint {
    /// An unlimited reaction point (`RC` = `RT` = `rpg_max_rate`).
    pub fn new(params: DcqcnParams) -> ReactionPoint {
        ReactionPoint {
            params,
            limited: false,
            rc: params.rpg_max_rate,
            rt: params.rpg_max_rate,
            alpha: ALPHA_ONE,
            t_count: 0,
            bc_count: 0,
            bytes: 0,
            alpha_at: None,
            increase_at: None,
            last_cut: None,
            last_tx: Instant::ZERO,
            last_bits: 0,
            tat: Instant::ZERO,
            window: None,
            span: None,
            stats: RpStats::default(),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &DcqcnParams {
        &self.params
    }

    /// Whether a rate limiter is in place.
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// The current rate `RC`, bit/s.
    pub fn rate(&self) -> u64 {
        self.rc
    }

    /// The target rate `RT`, bit/s.
    pub fn target_rate(&self) -> u64 {
        self.rt
    }

    /// `alpha` in units of 2^-20 ([`ALPHA_ONE`] is 1.0).
    pub fn alpha(&self) -> u64 {
        self.alpha
    }

    /// The timer and byte-counter stages `(T, BC)` since the last CNP.
    pub fn stages(&self) -> (u32, u32) {
        (self.t_count, self.bc_count)
    }

    /// Counters.
    pub fn stats(&self) -> RpStats {
        self.stats
    }

    /// A CNP for this QP arrived at `now` (IBTA vol. 1 Annex A17.9.3): cut the rate.
    pub fn on_cnp(&mut self, now: Instant) {
        self.stats.cnps += 1;
        let p = self.params;
        if !self.limited {
            self.limited = true;
            self.alpha = (u64::from(p.initial_alpha_value.min(1024))) << (ALPHA_SHIFT - 10);
            if p.rate_to_set_on_first_cnp != 0 {
                let r = p
                    .rate_to_set_on_first_cnp
                    .clamp(p.rpg_min_rate.min(p.rpg_max_rate), p.rpg_max_rate);
                self.rc = r;
                self.rt = r;
                self.restart(now);
                self.stats.cuts += 1;
                return;
            }
        } else if self
            .last_cut
            .is_some_and(|t| now.saturating_duration_since(t) < p.rate_reduce_monitor_period)
        {
            self.stats.cnps_ignored += 1;
            return;
        }
        self.rt = self.rc;
        let shift = ALPHA_SHIFT + p.rpg_gd.clamp(10, 20) - 10;
        let cut = ((u128::from(self.rc) * u128::from(self.alpha)) >> shift) as u64;
        let floor = (u128::from(self.rc) * u128::from(p.rpg_min_dec_fac.min(100)) / 100) as u64;
        self.rc = self
            .rc
            .saturating_sub(cut)
            .max(floor)
            .max(p.rpg_min_rate)
            .min(p.rpg_max_rate);
        let g = p.g();
        self.alpha = (decay(self.alpha, g) + g).min(ALPHA_ONE);
        self.restart(now);
        self.stats.cuts += 1;
    }

    /// Restarts the increase stages and both timers after a cut.
    fn restart(&mut self, now: Instant) {
        self.t_count = 0;
        self.bc_count = 0;
        self.bytes = 0;
        self.last_cut = Some(now);
        self.alpha_at = Some(now + self.params.dce_tcp_rtt.max(Duration::from_nanos(1)));
        self.increase_at = Some(now + self.params.rpg_time_reset.max(Duration::from_nanos(1)));
    }

    /// The QP sent a packet of `wire_bytes` bytes (see [`wire_bytes`]) at `now`: the pacer holds
    /// the next one back by `8 * wire_bytes / RC` (at the `RC` in force when the next may go: a
    /// rate raised meanwhile shortens the wait, as a NIC's rate limiter refills at its current
    /// rate) and the byte counter advances. A packet sent early is taken to have left at its
    /// pacing time. Nothing happens while unlimited, unless [`DcqcnParams::pace_at_max_rate`]
    /// is set: then the packet holds the next one back at `rpg_max_rate` (and counts in
    /// [`RpStats::paced_bytes`]), the byte counter stays.
    pub fn on_sent(&mut self, now: Instant, wire_bytes: u64) {
        if !self.limited {
            if self.params.pace_at_max_rate {
                self.last_tx = self.pacing_time(now);
                self.last_bits = wire_bytes.saturating_mul(8);
                self.tat = self.allowed().unwrap_or(now);
                self.account(now, wire_bytes);
            }
            return;
        }
        self.account(now, wire_bytes);
        self.last_tx = self.pacing_time(now);
        self.last_bits = wire_bytes.saturating_mul(8);
        self.tat = self.allowed().unwrap_or(now);
        self.bytes = self.bytes.saturating_add(wire_bytes);
        let b = self.params.rpg_byte_reset.max(1);
        let mut n = 0;
        while self.bytes >= b && self.limited && n < MAX_CATCH_UP {
            self.bytes -= b;
            self.bc_count = self.bc_count.saturating_add(1);
            self.stats.byte_increases += 1;
            self.increase();
            n += 1;
        }
    }

    /// The time a packet sent at `now` is taken to have left: its allowed time, or `now` if
    /// later, less the burst allowance (never before its allowed time).
    fn pacing_time(&self, now: Instant) -> Instant {
        let credit = if self.params.pace_burst == 0 {
            0
        } else {
            let nanos = (u128::from(self.params.pace_burst) * 8 * 1_000_000_000)
                .div_ceil(u128::from(self.rc.max(1)));
            u64::try_from(nanos).unwrap_or(u64::MAX)
        };
        if credit == 0 {
            return self.allowed().map_or(now, |t| t.max(now));
        }
        // GCRA (ITU-T I.371's virtual scheduling) with tolerance `credit`: the previous
        // packet's theoretical end stays in `tat` after its deadline passed, so that the
        // credit is earned by time, never renewed by a passed deadline.
        let late = Instant::from_nanos(now.as_nanos().saturating_sub(credit));
        self.allowed().unwrap_or(self.tat).max(late)
    }

    /// Counts a paced packet of `wire_bytes` sent at `now`: [`RpStats::paced_bytes`], the
    /// accounting window ([`RpStats::paced_window_max`]) and the span.
    fn account(&mut self, now: Instant, wire_bytes: u64) {
        self.stats.paced_bytes = self.stats.paced_bytes.saturating_add(wire_bytes);
        let w = self.params.rpg_time_reset.max(Duration::from_nanos(1));
        let (mut start, mut bytes) = self.window.unwrap_or((now, 0));
        if now >= start + w {
            // Skip whole windows: the one holding `now` starts a multiple of `w` after `start`.
            let w_ns = w.as_nanos().max(1);
            let k = (now - start).as_nanos() / w_ns;
            start = start.saturating_add_nanos(u64::try_from(k * w_ns).unwrap_or(u64::MAX));
            bytes = 0;
        }
        bytes = bytes.saturating_add(wire_bytes);
        self.window = Some((start, bytes));
        self.stats.paced_window_max = self.stats.paced_window_max.max(bytes);
        let first = self.span.map_or(now, |(f, _, _)| f);
        self.span = Some((first, now, wire_bytes));
    }

    /// The achieved pacing over the whole run: `(bytes, from, to)`, the wire bytes of the
    /// paced packets sent from the first (at `from`) up to but not including the last (at
    /// `to`), so that `8 x bytes / (to - from)` is the achieved rate in bit/s, at most `RC`
    /// where `RC` stayed constant (each packet holds the next back by its own wire time), less
    /// where the driver sent late or the QP had no work. `None` before the second paced packet.
    pub fn paced_span(&self) -> Option<(u64, Instant, Instant)> {
        let (first, last, last_bytes) = self.span?;
        (last > first).then(|| {
            (
                self.stats.paced_bytes.saturating_sub(last_bytes),
                first,
                last,
            )
        })
    }

    /// When the next packet may start at the current rate, if a packet holds it back.
    fn allowed(&self) -> Option<Instant> {
        if (!self.limited && !self.params.pace_at_max_rate) || self.last_bits == 0 {
            return None;
        }
        let nanos =
            (u128::from(self.last_bits) * 1_000_000_000).div_ceil(u128::from(self.rc.max(1)));
        Some(
            self.last_tx
                .saturating_add_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)),
        )
    }

    /// When the paced QP may send its next packet (`None`: now; unlimited or not held back).
    pub fn next_send(&self, now: Instant) -> Option<Instant> {
        self.allowed().filter(|&t| t > now)
    }

    /// The pacing time of the last packet sent, until [`ReactionPoint::handle_timeout`] passes
    /// it (`None` while unlimited or once passed): the engine's wake-up for a paced requester.
    pub fn pacing_deadline(&self) -> Option<Instant> {
        self.allowed()
    }

    /// The earliest timer (alpha or rate increase), `None` while unlimited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.limited {
            return None;
        }
        match (self.alpha_at, self.increase_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The time reached `now`: run the alpha timer and the rate-increase timer for every period
    /// that ended (at most 4096 of each; then they restart from `now`).
    pub fn handle_timeout(&mut self, now: Instant) {
        let k = self.params.dce_tcp_rtt.max(Duration::from_nanos(1));
        let mut n = 0;
        while let Some(at) = self.alpha_at.filter(|&at| at <= now && self.limited) {
            let g = self.params.g();
            self.alpha = decay(self.alpha, g);
            n += 1;
            self.alpha_at = Some(if n >= MAX_CATCH_UP { now + k } else { at + k });
        }
        let t = self.params.rpg_time_reset.max(Duration::from_nanos(1));
        let mut n = 0;
        while let Some(at) = self.increase_at.filter(|&at| at <= now && self.limited) {
            self.t_count = self.t_count.saturating_add(1);
            self.stats.timer_increases += 1;
            n += 1;
            self.increase_at = Some(if n >= MAX_CATCH_UP { now + t } else { at + t });
            self.increase();
        }
        if self.allowed().is_some_and(|t| t <= now) {
            // Passed: a packet sent from now on is spaced from its own time.
            self.last_bits = 0;
        }
    }

    /// One rate-increase event (the stage counters were just advanced).
    fn increase(&mut self) {
        let p = self.params;
        let f = p.rpg_threshold;
        let (t, bc) = (self.t_count, self.bc_count);
        if t.max(bc) < f {
            // Fast recovery: RT stays.
        } else if t.min(bc) > f {
            let i = u64::from(t.min(bc) - f);
            self.rt = self.rt.saturating_add(i.saturating_mul(p.rpg_hai_rate));
        } else {
            self.rt = self.rt.saturating_add(p.rpg_ai_rate);
        }
        self.rt = self.rt.min(p.rpg_max_rate);
        self.rc = self
            .rc
            .saturating_add(self.rt)
            .div_ceil(2)
            .min(p.rpg_max_rate);
        if self.rc >= p.rpg_max_rate {
            self.release();
        }
    }

    /// `RC` is back at the line rate: remove the limiter.
    fn release(&mut self) {
        self.limited = false;
        self.rc = self.params.rpg_max_rate;
        self.rt = self.params.rpg_max_rate;
        self.alpha_at = None;
        self.increase_at = None;
        self.t_count = 0;
        self.bc_count = 0;
        self.bytes = 0;
        self.last_bits = 0;
        self.stats.releases += 1;
    }
}

/// `(1 - g) * alpha`, both in units of 2^-20, rounded down.
fn decay(alpha: u64, g: u64) -> u64 {
    ((u128::from(alpha) * u128::from(ALPHA_ONE.saturating_sub(g))) >> ALPHA_SHIFT) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const G40: u64 = 40_000_000_000;

    fn us(n: u64) -> Instant {
        Instant::from_micros(n)
    }

    #[test]
    fn one_cnp_halves_the_rate_and_arms_both_timers() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        assert!(!rp.is_limited());
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.next_send(us(0)), None);
        rp.on_cnp(us(10));
        // alpha = 1: RC = 40 G * (1 - 1/2); RT = the old RC; alpha = (1 - g) 1 + g = 1.
        assert_eq!(rp.rate(), 20_000_000_000);
        assert_eq!(rp.target_rate(), G40);
        assert_eq!(rp.alpha(), ALPHA_ONE);
        assert_eq!(rp.poll_timeout(), Some(us(65)));
        assert_eq!(rp.stats().cuts, 1);
    }

    #[test]
    fn burst_of_cnps_with_alpha_decay_between() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        rp.on_cnp(us(0));
        // 55 us: alpha timer (alpha = 1 - 1/256 = 1044480 / 2^20) and the first timer increase
        // (fast recovery: RC = (40 G + 20 G) / 2).
        rp.handle_timeout(us(55));
        assert_eq!(rp.alpha(), 1_044_480);
        assert_eq!(rp.rate(), 30_000_000_000);
        assert_eq!(rp.stages(), (1, 0));
        // 60 us: RT = 30 G; RC = 30 G (1 - 0.498046875) = 15 058 593 750;
        // alpha = 1044480 (1 - 1/256) + 4096 = 1040400 + 4096.
        rp.on_cnp(us(60));
        assert_eq!(rp.target_rate(), 30_000_000_000);
        assert_eq!(rp.rate(), 15_058_593_750);
        assert_eq!(rp.alpha(), 1_044_496);
        assert_eq!(rp.stages(), (0, 0));
        // 61 us: cut again with the new alpha: 15 058 593 750 * 1044496 / 2^21, rounded down.
        rp.on_cnp(us(61));
        let cut = ((15_058_593_750u128 * 1_044_496) >> 21) as u64;
        assert_eq!(rp.rate(), 15_058_593_750 - cut);
        assert_eq!(rp.target_rate(), 15_058_593_750);
        // The timers restarted at the last CNP.
        assert_eq!(rp.poll_timeout(), Some(us(116)));
        assert_eq!(rp.stats().cnps, 3);
    }

    #[test]
    fn recovery_stages_fast_recovery_then_additive_increase() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        rp.on_cnp(us(0)); // RC 20 G, RT 40 G
        rp.on_cnp(us(1)); // RC 10 G, RT 20 G (alpha still 1)
        assert_eq!(
            (rp.rate(), rp.target_rate()),
            (10_000_000_000, 20_000_000_000)
        );
        // Timer events at 56, 111, 166, 221 us: fast recovery toward RT = 20 G.
        let expect_fr = [
            15_000_000_000,
            17_500_000_000,
            18_750_000_000,
            19_375_000_000u64,
        ];
        for (i, rc) in expect_fr.iter().enumerate() {
            rp.handle_timeout(us(1 + 55 * (i as u64 + 1)));
            assert_eq!(rp.rate(), *rc, "fast recovery stage {}", i + 1);
            assert_eq!(rp.target_rate(), 20_000_000_000);
        }
        // T = 5 = F: additive increase, RT += 40 Mb/s, RC = (RT + RC) / 2.
        rp.handle_timeout(us(1 + 55 * 5));
        assert_eq!(rp.target_rate(), 20_040_000_000);
        assert_eq!(rp.rate(), 19_707_500_000);
        rp.handle_timeout(us(1 + 55 * 6));
        assert_eq!(rp.target_rate(), 20_080_000_000);
        assert_eq!(rp.rate(), 19_893_750_000);
        assert_eq!(rp.stages(), (6, 0));
        assert_eq!(rp.stats().timer_increases, 6);
    }

    fn small() -> DcqcnParams {
        DcqcnParams {
            rpg_max_rate: 100_000_000_000,
            rpg_ai_rate: 1_000_000_000,
            rpg_hai_rate: 5_000_000_000,
            rpg_time_reset: Duration::from_micros(10),
            rpg_byte_reset: 1000,
            rpg_threshold: 1,
            rate_to_set_on_first_cnp: 10_000_000_000,
            ..DcqcnParams::paper(100_000_000_000)
        }
    }

    #[test]
    fn byte_counter_and_timer_drive_additive_then_hyper_increase() {
        let mut rp = ReactionPoint::new(small());
        rp.on_cnp(us(0));
        assert_eq!(
            (rp.rate(), rp.target_rate()),
            (10_000_000_000, 10_000_000_000)
        );
        // 1000 bytes: BC = 1, T = 0: max = F, min < F: additive.
        rp.on_sent(us(1), 1000);
        assert_eq!(rp.stages(), (0, 1));
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (11_000_000_000, 10_500_000_000)
        );
        // Timer: T = 1, BC = 1: additive.
        rp.handle_timeout(us(10));
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (12_000_000_000, 11_250_000_000)
        );
        rp.on_sent(us(11), 1000); // BC = 2, T = 1: additive
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (13_000_000_000, 12_125_000_000)
        );
        // T = 2, BC = 2: both past F: hyper increase, i = 1.
        rp.handle_timeout(us(20));
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (18_000_000_000, 15_062_500_000)
        );
        rp.on_sent(us(21), 1000); // BC = 3, T = 2: i = 1
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (23_000_000_000, 19_031_250_000)
        );
        rp.handle_timeout(us(30)); // T = 3, BC = 3: i = 2
        assert_eq!(
            (rp.target_rate(), rp.rate()),
            (33_000_000_000, 26_015_625_000)
        );
        assert_eq!(rp.stats().byte_increases, 3);
        assert_eq!(rp.stats().timer_increases, 3);
        // Bytes below B carry over: 999 then 1 make one event.
        rp.on_sent(us(31), 999);
        assert_eq!(rp.stages(), (3, 3));
        rp.on_sent(us(31), 1);
        assert_eq!(rp.stages(), (3, 4));
    }

    #[test]
    fn minimum_rate_and_largest_cut() {
        let p = DcqcnParams {
            rpg_min_rate: 5_000_000_000,
            ..DcqcnParams::paper(G40)
        };
        let mut rp = ReactionPoint::new(p);
        let mut rates = [0u64; 5];
        for (i, r) in rates.iter_mut().enumerate() {
            rp.on_cnp(us(i as u64));
            *r = rp.rate();
        }
        let g = 1_000_000_000;
        assert_eq!(rates, [20 * g, 10 * g, 5 * g, 5 * g, 5 * g]);
        // rpg_gd 10: the cut is alpha itself (all of RC at alpha 1); rpg_min_dec_fac keeps 50 %.
        let mut rp = ReactionPoint::new(DcqcnParams {
            rpg_gd: 10,
            rpg_min_dec_fac: 50,
            ..DcqcnParams::paper(G40)
        });
        rp.on_cnp(us(0));
        assert_eq!(rp.rate(), 20 * g);
    }

    #[test]
    fn pacing_spaces_packets_by_their_wire_time() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        rp.on_sent(us(0), 1250);
        assert_eq!(rp.next_send(us(0)), None, "unlimited: never held back");
        rp.on_cnp(us(0)); // 20 Gb/s
        rp.on_sent(us(0), 1250); // 10 000 bits at 20 Gb/s: 500 ns
        assert_eq!(rp.next_send(us(0)), Some(Instant::from_nanos(500)));
        rp.on_sent(Instant::from_nanos(100), 1250);
        assert_eq!(rp.next_send(us(0)), Some(Instant::from_nanos(1000)));
        assert_eq!(rp.next_send(Instant::from_nanos(1000)), None);
        // Idle time earns no credit: the next packet after a pause is spaced from now.
        rp.on_sent(us(5), 1250);
        assert_eq!(rp.next_send(us(5)), Some(Instant::from_nanos(5500)));
        assert_eq!(wire_bytes(1078, false), 1078 + 66);
        assert_eq!(wire_bytes(1078, true), 1078 + 86);
    }

    #[test]
    fn paper_scaled_is_the_paper_at_40_gbps_and_scales_below() {
        assert_eq!(
            DcqcnParams::paper_scaled(G40),
            DcqcnParams {
                rate_reduce_monitor_period: Duration::from_micros(50),
                ..DcqcnParams::paper(G40)
            }
        );
        // 16 Mb/s: s = 2500.
        let p = DcqcnParams::paper_scaled(16_000_000);
        assert_eq!(
            (
                p.rpg_ai_rate,
                p.rpg_hai_rate,
                p.rpg_byte_reset,
                p.rpg_min_rate
            ),
            (16_000, 160_000, 10_000_000, 160_000)
        );
        assert_eq!(p.rpg_time_reset, Duration::from_micros(137_500));
        assert_eq!(p.dce_tcp_rtt, Duration::from_micros(137_500));
        assert_eq!(p.rate_reduce_monitor_period, Duration::from_micros(125_000));
        let tiny = DcqcnParams::paper_scaled(0);
        assert_eq!(
            (
                tiny.rpg_max_rate,
                tiny.rpg_ai_rate,
                tiny.rpg_hai_rate,
                tiny.rpg_min_rate
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(tiny.rpg_time_reset, Duration::from_nanos(55_000 * G40));
    }

    #[test]
    fn pace_at_max_rate_spaces_an_unlimited_qp_at_the_line_rate() {
        let mut rp = ReactionPoint::new(DcqcnParams {
            pace_at_max_rate: true,
            ..DcqcnParams::paper(1_000_000_000)
        });
        // 1250 wire bytes = 10 000 bits at 1 Gb/s: 10 us, before any CNP.
        rp.on_sent(us(0), 1250);
        assert!(!rp.is_limited());
        assert_eq!(rp.next_send(us(0)), Some(us(10)));
        assert_eq!(rp.poll_timeout(), None, "no DCQCN timers while unlimited");
        // Sent early (at 4 us): taken to have left at 10 us.
        rp.on_sent(us(4), 1250);
        assert_eq!(rp.next_send(us(4)), Some(us(20)));
        rp.handle_timeout(us(20));
        assert_eq!(rp.pacing_deadline(), None);
        // A CNP halves the rate: 20 us per packet; the byte counter runs only while limited.
        rp.on_cnp(us(30));
        rp.on_sent(us(30), 1250);
        assert_eq!(rp.next_send(us(30)), Some(us(50)));
        assert_eq!(rp.stats().paced_bytes, 3 * 1250);
        // Sent at 0, 4 and 30 us: 2500 bytes over the first two, 30 us apart.
        assert_eq!(rp.paced_span(), Some((2500, us(0), us(30))));
        // One window of T = 55 us held all three.
        assert_eq!(rp.stats().paced_window_max, 3 * 1250);
        // Off (the default): an unlimited QP is never held back and counts nothing.
        let mut off = ReactionPoint::new(DcqcnParams::paper(1_000_000_000));
        off.on_sent(us(0), 1250);
        assert_eq!((off.next_send(us(0)), off.stats().paced_bytes), (None, 0));
    }

    #[test]
    fn paced_windows_stay_within_the_configured_bytes() {
        // 1 Gb/s, T = 55 us: 6875 bytes per window configured; 1250-byte packets every 10 us.
        let mut rp = ReactionPoint::new(DcqcnParams {
            pace_at_max_rate: true,
            ..DcqcnParams::paper(1_000_000_000)
        });
        let mut now = us(3);
        for _ in 0..100 {
            rp.on_sent(now, 1250);
            now = rp.next_send(now).expect("held back");
            rp.handle_timeout(now);
        }
        // Windows [3, 58) us and on: six packets in each at most (7500 <= 6875 + one packet).
        assert_eq!(rp.stats().paced_window_max, 7500);
        assert_eq!(rp.paced_span(), Some((99 * 1250, us(3), us(993))));
        // 99 x 10 000 bits over 990 us: exactly the line rate.
        let (bytes, from, to) = rp.paced_span().unwrap();
        assert_eq!(
            bytes * 8 * 1_000_000_000 / (to - from).as_nanos() as u64,
            1_000_000_000
        );
    }

    #[test]
    fn burst_allowance_lets_a_late_or_idle_qp_catch_up_and_no_more() {
        // 1 Gb/s: 1250 bytes take 10 us; burst 2500 bytes = 20 us of credit.
        let mut rp = ReactionPoint::new(DcqcnParams {
            pace_at_max_rate: true,
            pace_burst: 2500,
            ..DcqcnParams::paper(1_000_000_000)
        });
        // Idle until 100 us: the burst and one packet go back to back, the fourth waits.
        for _ in 0..3 {
            assert_eq!(rp.next_send(us(100)), None);
            rp.on_sent(us(100), 1250);
        }
        assert_eq!(rp.next_send(us(100)), Some(us(110)));
        rp.handle_timeout(us(110));
        rp.on_sent(us(110), 1250);
        assert_eq!(rp.next_send(us(110)), Some(us(120)));
        // The driver wakes 15 us late: the packet it missed goes at once, then spacing resumes
        // from the theoretical times (not from the late wake-up).
        rp.handle_timeout(us(135));
        rp.on_sent(us(135), 1250);
        assert_eq!(rp.next_send(us(135)), None);
        rp.on_sent(us(135), 1250);
        assert_eq!(rp.next_send(us(135)), Some(us(140)));
        // A passed deadline renews no credit: at 140 one packet, then 150.
        rp.handle_timeout(us(140));
        rp.on_sent(us(140), 1250);
        assert_eq!(rp.next_send(us(140)), Some(us(150)));
        assert_eq!(rp.stats().paced_bytes, 7 * 1250);
    }

    #[test]
    fn a_rate_raised_meanwhile_shortens_the_wait() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        rp.on_cnp(us(0)); // RC 20 G, RT 40 G
        rp.on_cnp(us(0)); // RC 10 G, RT 20 G
        rp.on_cnp(us(0)); // RC 5 G, RT 10 G
        rp.on_sent(us(54), 62_500); // 500 000 bits: 100 us at 5 Gb/s
        assert_eq!(rp.next_send(us(54)), Some(us(154)));
        // 55 us: fast recovery to 7.5 Gb/s: the same bits take 66 667 ns from 54 us.
        rp.handle_timeout(us(55));
        assert_eq!(rp.rate(), 7_500_000_000);
        assert_eq!(
            rp.next_send(us(55)),
            Some(Instant::from_nanos(54_000 + 66_667))
        );
        assert_eq!(rp.pacing_deadline(), rp.next_send(us(55)));
        // Once passed, nothing holds the next packet back.
        rp.handle_timeout(us(121));
        assert_eq!(rp.pacing_deadline(), None);
    }

    #[test]
    fn recovers_to_line_rate_and_removes_the_limiter() {
        let mut rp = ReactionPoint::new(DcqcnParams::paper(G40));
        rp.on_cnp(us(0));
        let mut released_at = None;
        for k in 1..=200u64 {
            rp.handle_timeout(us(55 * k));
            if !rp.is_limited() {
                released_at = Some(k);
                break;
            }
        }
        // RC halves its distance to RT = 40 G each period (rounded up): 20 G needs about
        // log2(20e9) = 35 periods to close.
        let k = released_at.expect("released within 200 periods");
        assert!((30..=40).contains(&k), "released after {k} periods");
        assert_eq!(rp.rate(), G40);
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.stats().releases, 1);
        // A driver that wakes very late catches up in bounded work.
        rp.on_cnp(us(20_000));
        rp.handle_timeout(Instant::from_nanos(u64::MAX / 2));
        assert!(!rp.is_limited());
    }

    #[test]
    fn monitor_period_ignores_cnps_right_after_a_cut() {
        let mut rp = ReactionPoint::new(DcqcnParams::mlx5(G40));
        rp.on_cnp(us(0));
        let after_first = rp.rate();
        // mlx5: alpha starts at 1023/1024: RC = 40 G - 40 G * (1023 * 1024) / 2^21.
        assert_eq!(after_first, G40 - ((G40 as u128 * 1_047_552) >> 21) as u64);
        rp.on_cnp(us(2));
        assert_eq!(rp.rate(), after_first);
        assert_eq!(rp.stats().cnps_ignored, 1);
        rp.on_cnp(us(5));
        assert!(rp.rate() < after_first);
        assert_eq!(rp.stats().cuts, 2);
    }
}
