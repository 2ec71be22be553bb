//! The verbs conformance suite: one set of behaviour checks, written once against
//! [`hca::verbs::Verbs`], run on every backend (the software HCA on the in-memory fabric, the
//! software HCA over UDP, an RDMA device through libibverbs), and compared.
//!
//! # Cases and records
//! A [`Case`] drives two devices, `a` (the requester) and `b` (the responder; it may be the same
//! device as `a`, as with one HCA looping back to itself), through the public verbs API: it
//! creates its own PD, CQs, MRs and QPs, connects them, posts work and polls completions, and
//! destroys everything again. It returns a [`Record`]: what it observed, as `key=value` fields
//! that mean the same on every backend (completion statuses, opcodes, byte counts, immediate
//! data, data digests, errnos of refused verbs, QP states; QPNs shown as role names like `a0`,
//! never as numbers), and the failures of its own checks against the rules it is named after
//! (IBTA vol. 1 chapters 9 to 11, ibv_post_send(3), ibv_poll_cq(3)). Fields follow
//! ibv_poll_cq(3): an error completion shows only its `wr_id`, status and QP, the fields the
//! man page says are valid; `byte_len` is shown for receive completions only.
//!
//! A suite run ([`run_suite`]) gives one record per case. Two runs on different backends are
//! compared with [`compare`]: any field that differs is a [`Difference`] naming the case, the
//! field and both values, unless [`KNOWN_DIFFERENCES`] documents it for that backend.
//!
//! # Records on disk
//! [`write_records`] / [`read_records`]: one line per case, `case<TAB>key=value<TAB>...`, then
//! `!failure text` fields for failed checks. A reference run on one machine can be compared
//! with a run on another (the guest test writes the host's records where the guest reads them).
//!
//! # Time
//! Every wait is bounded ([`WAIT`] for completions a case expects, [`QUIET`] for a check that
//! nothing more arrives); no case asserts on how long anything took.

mod backend;
mod cases;
mod harness;

use std::fmt;
use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use hca::verbs::Verbs;

pub use backend::{open_pair, BackendError, DevicePair, SPEC_HELP};
pub use cases::CASES;

/// Bound on a wait for completions a case expects (a loaded machine, a TCG guest: generous; a
/// hang is a failure, not a wait).
pub const WAIT: Duration = Duration::from_secs(20);

/// How long a case waits to see that nothing more arrives (a bound, not a measurement: a
/// completion that should not exist fails the case whenever it shows up).
pub const QUIET: Duration = Duration::from_millis(200);

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name (what `--case` selects and differences name).
    pub name: &'static str,
    /// The rule it checks, with its source.
    pub rule: &'static str,
    /// Runs it on devices `a` and `b`, filling the record.
    pub run: fn(&Devices, &mut Record) -> Result<(), String>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// The two devices a case runs on (`b` may be the same device as `a`).
#[derive(Debug, Clone)]
pub struct Devices {
    /// The requester side.
    pub a: Arc<dyn Verbs>,
    /// The responder side.
    pub b: Arc<dyn Verbs>,
}

/// What a case observed, and which of its checks failed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The case's name.
    pub case: String,
    /// Observations in the order the case made them: `(key, value)`.
    pub fields: Vec<(String, String)>,
    /// The checks that failed, one line each (empty: the case passed its own checks).
    pub failures: Vec<String>,
}

impl Record {
    /// An empty record for `case`.
    pub fn new(case: &str) -> Record {
        Record {
            case: case.to_owned(),
            ..Record::default()
        }
    }

    /// Records an observation (a later one with the same key is kept as well, in order).
    pub fn set(&mut self, key: impl Into<String>, value: impl fmt::Display) {
        self.fields
            .push((clean(&key.into()), clean(&value.to_string())));
    }

    /// Records a failed check unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(clean(&what()));
        }
    }

    /// Records a failed check when `got != want`, naming both.
    pub fn expect_eq<T: PartialEq + fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.failures
                .push(clean(&format!("{what}: got {got:?}, expected {want:?}")));
        }
    }

    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the case passed its own checks.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Keeps a value on one line of the record file: tabs and line breaks become spaces.
fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.case)?;
        for (k, v) in &self.fields {
            write!(f, " {k}={v}")?;
        }
        for fail in &self.failures {
            write!(f, " !{fail}")?;
        }
        Ok(())
    }
}

/// The cases whose name contains `filter` (all for an empty filter).
pub fn select(filter: &str) -> Vec<&'static Case> {
    CASES.iter().filter(|c| c.name.contains(filter)).collect()
}

/// Runs `cases` in order on `devices`; one record each. A case that could not run (a verb it
/// needs for setup was refused) has that as a failure in its record.
pub fn run_suite(devices: &Devices, cases: &[&Case]) -> Vec<Record> {
    cases
        .iter()
        .map(|case| {
            let mut record = Record::new(case.name);
            if let Err(e) = (case.run)(devices, &mut record) {
                record.failures.push(clean(&format!("could not run: {e}")));
            }
            record
        })
        .collect()
}

/// A documented, legitimate difference of one backend from the software reference in one field
/// of one case (a device limit, an optional feature). [`compare`] accepts exactly these.
#[derive(Debug, Clone, Copy)]
pub struct KnownDifference {
    /// The case.
    pub case: &'static str,
    /// The field.
    pub field: &'static str,
    /// Backends (device name prefixes, e.g. `verbs:rxe`) the difference applies to.
    pub backend: &'static str,
    /// Why it is legitimate, with the source.
    pub reason: &'static str,
}

/// The documented differences. Between the software backends (fabric, UDP) there are none: they
/// run the same engine, and any difference is a bug of a link.
pub const KNOWN_DIFFERENCES: &[KnownDifference] = &[];

/// One difference between two runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The case.
    pub case: String,
    /// The field (`<missing case>` when one run lacks the case, `<fields>` when the runs
    /// observed different sets of fields).
    pub field: String,
    /// The value in the first run (`-` if absent).
    pub left: String,
    /// The value in the second run (`-` if absent).
    pub right: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "case {}: {}: {} | {}",
            self.case, self.field, self.left, self.right
        )
    }
}

/// Compares two runs field by field. `right_backend` (a device name such as `verbs:rxe0`)
/// selects which [`KNOWN_DIFFERENCES`] apply. Check failures are not compared (each run's own
/// failures are reported by the caller).
pub fn compare(left: &[Record], right: &[Record], right_backend: &str) -> Vec<Difference> {
    let mut out = Vec::new();
    let known = |case: &str, field: &str| {
        KNOWN_DIFFERENCES
            .iter()
            .any(|k| k.case == case && k.field == field && right_backend.starts_with(k.backend))
    };
    for l in left {
        let Some(r) = right.iter().find(|r| r.case == l.case) else {
            out.push(Difference {
                case: l.case.clone(),
                field: "<missing case>".into(),
                left: "ran".into(),
                right: "-".into(),
            });
            continue;
        };
        let n = l.fields.len().max(r.fields.len());
        for i in 0..n {
            let lf = l.fields.get(i);
            let rf = r.fields.get(i);
            match (lf, rf) {
                (Some((lk, lv)), Some((rk, rv))) if lk == rk => {
                    if lv != rv && !known(&l.case, lk) {
                        out.push(Difference {
                            case: l.case.clone(),
                            field: lk.clone(),
                            left: lv.clone(),
                            right: rv.clone(),
                        });
                    }
                }
                _ => {
                    let show = |f: Option<&(String, String)>| {
                        f.map_or("-".to_owned(), |(k, v)| format!("{k}={v}"))
                    };
                    let field = lf.or(rf).map_or("<fields>", |(k, _)| k.as_str());
                    if !known(&l.case, field) {
                        out.push(Difference {
                            case: l.case.clone(),
                            field: format!("<fields> at #{i}"),
                            left: show(lf),
                            right: show(rf),
                        });
                    }
                    // After a structural mismatch the rest of the fields would only repeat it.
                    break;
                }
            }
        }
    }
    for r in right {
        if !left.iter().any(|l| l.case == r.case) {
            out.push(Difference {
                case: r.case.clone(),
                field: "<missing case>".into(),
                left: "-".into(),
                right: "ran".into(),
            });
        }
    }
    out
}

/// Writes records, one line each (see the [module docs](self#records-on-disk)).
///
/// # Errors
/// The writer's.
pub fn write_records(mut w: impl Write, records: &[Record]) -> io::Result<()> {
    for r in records {
        write!(w, "{}", r.case)?;
        for (k, v) in &r.fields {
            write!(w, "\t{k}={v}")?;
        }
        for f in &r.failures {
            write!(w, "\t!{f}")?;
        }
        writeln!(w)?;
    }
    w.flush()
}

/// Reads what [`write_records`] wrote. Blank lines and lines starting with `#` are skipped.
///
/// # Errors
/// The reader's; `InvalidData` for a field without `=`, naming its line.
pub fn read_records(r: impl BufRead) -> io::Result<Vec<Record>> {
    let mut out = Vec::new();
    for (n, line) in r.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split('\t');
        let mut record = Record::new(parts.next().unwrap_or_default());
        for part in parts {
            if let Some(fail) = part.strip_prefix('!') {
                record.failures.push(fail.to_owned());
            } else if let Some((k, v)) = part.split_once('=') {
                record.fields.push((k.to_owned(), v.to_owned()));
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("record line {}: field without '=': {part:?}", n + 1),
                ));
            }
        }
        out.push(record);
    }
    Ok(out)
}
