//! The verbs conformance suite (`tests::conformance`) on the software backends: the software
//! HCA on the in-memory fabric, and the software HCA over UDP (two devices, 127.0.0.1 and
//! 127.0.0.2, on ephemeral ports). Each run must pass every case's own checks, and the two runs'
//! records must agree field for field; a difference names the case, the field and both values.

use tests::conformance::{
    self, compare, open_pair, read_records, run_suite, write_records, BackendError,
};

fn run(link: &str, link2: Option<&str>) -> (String, Vec<conformance::Record>) {
    let pair = open_pair(link, link2).unwrap_or_else(|e| panic!("{e}"));
    let cases = conformance::select("");
    let records = run_suite(&pair.devices, &cases);
    (pair.name, records)
}

fn failures(name: &str, records: &[conformance::Record]) -> Vec<String> {
    records
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{name}: {r}"))
        .collect()
}

#[test]
fn fabric_and_udp_backends_pass_and_agree() {
    let (fabric_name, fabric) = run("fabric", None);
    let (udp_name, udp) = run("udp:127.0.0.1", Some("udp:127.0.0.2"));
    assert_eq!(fabric.len(), conformance::CASES.len());
    let mut problems = failures(&fabric_name, &fabric);
    problems.extend(failures(&udp_name, &udp));
    problems.extend(
        compare(&fabric, &udp, &udp_name)
            .iter()
            .map(|d| format!("{fabric_name} vs {udp_name}: {d}")),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// One UDP device looping back to itself (what `--link` without `--link2` runs, as on a single
/// HCA) agrees with the fabric.
#[test]
fn one_udp_device_loopback_agrees_with_fabric() {
    let (_, fabric) = run("fabric", None);
    let (name, udp) = run("udp:127.0.0.1", None);
    let mut problems = failures(&name, &udp);
    problems.extend(compare(&fabric, &udp, &name).iter().map(|d| d.to_string()));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Records survive the file format, and a changed field is reported with the case, the field
/// and both values.
#[test]
fn records_round_trip_and_differences_are_named() {
    let (_, fabric) = run("fabric", None);
    let mut file = Vec::new();
    write_records(&mut file, &fabric).expect("write");
    let back = read_records(&file[..]).expect("read");
    assert_eq!(back, fabric);
    let mut changed = back.clone();
    let case = changed
        .iter_mut()
        .find(|r| r.case == "rc_atomics")
        .expect("rc_atomics ran");
    let field = case
        .fields
        .iter_mut()
        .find(|(k, _)| k == "final")
        .expect("final value recorded");
    field.1 = "13".into();
    let diffs = compare(&fabric, &changed, "test");
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(diffs[0].to_string(), "case rc_atomics: final: 12 | 13");
    changed.retain(|r| r.case != "rc_atomics");
    let diffs = compare(&fabric, &changed, "test");
    assert_eq!(diffs.len(), 1);
    assert_eq!(diffs[0].field, "<missing case>");
}

#[test]
fn unknown_and_unavailable_backends_are_clear_errors() {
    let e = open_pair("pci:0000:00:01.0", None).unwrap_err().to_string();
    assert!(e.contains("expected one of"), "{e}");
    let e = open_pair("fabric", Some("udp:127.0.0.1"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fabric"), "{e}");
    // A libibverbs device this host does not have (or no libibverbs, or no RDMA in the kernel):
    // an open error naming it, one line.
    let e = open_pair("verbs:no-such-dev9", None).unwrap_err();
    assert!(matches!(e, BackendError::Open { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("verbs:no-such-dev9"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// A documented deviation explains exactly its check on exactly its backend; every entry names a
/// case that exists and gives a reason.
#[test]
fn known_differences_explain_only_their_own_checks() {
    for k in conformance::KNOWN_DIFFERENCES {
        assert!(
            conformance::CASES.iter().any(|c| c.name == k.case),
            "{}",
            k.case
        );
        assert!(!k.reason.is_empty() && !k.backend.is_empty(), "{k:?}");
    }
    let mut r = conformance::Record::new("rc_loc_prot_err");
    r.failures
        .push("requester: got [(1, LocQpOpErr)], expected [(1, LocProtErr)]".into());
    assert!(conformance::unexplained_failures(&r, "verbs:rxe0").is_empty());
    assert_eq!(
        conformance::unexplained_failures(&r, "udp:127.0.0.1").len(),
        1
    );
    assert_eq!(conformance::unexplained_failures(&r, "fabric").len(), 1);
    r.failures
        .push("requester: got [(1, RemAccessErr)], expected [(1, LocProtErr)]".into());
    assert_eq!(conformance::unexplained_failures(&r, "verbs:rxe0").len(), 1);
}

/// A corrupted `--compare` file is an error naming its line, not a reference that silently
/// holds garbage "cases" (which made every real case a missing-case difference), and a file
/// with no record is an error too.
#[test]
fn corrupted_records_files_are_refused() {
    for (text, needle) in [
        (&b"garbage line\nmore junk\n"[..], "record line 1"),
        (
            b"rc_send_completions\tstatus=ok\nnot a record\n",
            "record line 2",
        ),
        (
            b"rc_send_completions\tno-equals-sign\n",
            "field without '='",
        ),
        (b"", "no records"),
        (b"# only a comment\n\n", "no records"),
    ] {
        let e = read_records(text).expect_err(&String::from_utf8_lossy(text));
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains(needle), "{e}");
    }
    let ok = read_records(&b"# comment\nrc_send_completions\tstatus=ok\n"[..]).unwrap();
    assert_eq!(ok.len(), 1);
}
