#!/usr/bin/env python3
"""Consistency check for the nccl-tests data in this folder (standard library only).

For every CSV here:
  * the header is the one expected for that file;
  * numeric columns hold numbers (or are empty where a source did not print them);
  * where a row has time and algbw: algbw == size / time, within print rounding;
  * where a row has algbw and busbw: busbw == algbw * factor, within print rounding,
    with the nccl-tests factors (doc/PERFORMANCE.md): all_reduce 2(n-1)/n;
    all_gather, reduce_scatter, alltoall (n-1)/n; sendrecv, broadcast, reduce 1.

Run:  python3 validate/data/nccl/check_nccl.py      (exit status 1 on any failure)
"""
import csv
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SCHEMA = ("source_id,collective,gpu_model,num_nodes,gpus_per_node,total_ranks,intra_node_fabric,"
          "inter_node_fabric,nic_gbit_per_s,nics_per_node,nccl_version,algorithm_note,nccl_env,size_bytes,"
          "count,dtype,redop,oop_time_us,oop_algbw_GBps,oop_busbw_GBps,ip_time_us,ip_algbw_GBps,"
          "ip_busbw_GBps,citation,transcription").split(",")

# Files copied unchanged from the earlier collection keep their own headers.
LEGACY = {
    "nccl_tests_measurements.csv": (
        "source_id,collective,gpu_model,num_nodes,gpus_per_node,total_ranks,intra_node_fabric,"
        "inter_node_fabric,nccl_version,algorithm_note,size_bytes,count,dtype,redop,oop_time_us,"
        "oop_algbw_GBps,oop_busbw_GBps,ip_time_us,ip_algbw_GBps,ip_busbw_GBps").split(","),
    "stas00_mlengineering_collective_measurements.csv": (
        "dataset,hardware,tool,collective,gpus_per_node,nodes,algorithm,size_bytes,time_us,algbw_GBps,"
        "busbw_GBps,busbw_nvls_off_GBps,software,note").split(","),
    "nccl_reference_points.csv": (
        "kind,source,collective,gpu,gpus_total,nodes,fabric,value_GBps,metric,"
        "statement_or_context").split(","),
    "nvlink_p2p_bandwidth_matrices_stas00.csv": (
        "hardware,tool,src_gpu,dst_gpu,bandwidth_GBps,note").split(","),
}

# Files whose value columns legitimately hold ranges or words ("46-48", "multi").
FREE_TEXT = {"nccl_reference_points.csv"}

INT_COLS = {"num_nodes", "gpus_per_node", "total_ranks", "nics_per_node", "size_bytes", "count",
            "nodes", "src_gpu", "dst_gpu"}
FLOAT_COLS = {"nic_gbit_per_s", "oop_time_us", "oop_algbw_GBps", "oop_busbw_GBps", "ip_time_us",
              "ip_algbw_GBps", "ip_busbw_GBps", "time_us", "algbw_GBps", "busbw_GBps",
              "busbw_nvls_off_GBps", "value_GBps", "bandwidth_GBps"}
REQUIRED = {"source_id", "collective", "size_bytes", "citation", "transcription"}
TRANSCRIPTIONS = {"parsed", "hand", "from plot"}


def factor(collective, n):
    c = collective.lower()
    if c == "all_reduce":
        return 2.0 * (n - 1) / n
    if c in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / float(n)
    if c in ("sendrecv", "broadcast", "reduce"):
        return 1.0
    raise ValueError("no bus-bandwidth factor for collective %r" % collective)


def half_ulp(text):
    """Half a unit in the last printed digit of a number as printed."""
    t = text.strip().lower()
    if "e" in t:
        mant, exp = t.split("e")
        return half_ulp(mant) * 10 ** int(exp)
    if "." in t:
        return 0.5 * 10 ** -len(t.split(".")[1])
    return 0.5


def check_algbw(size, t_txt, a_txt):
    """algbw printed == size / time (GB/s, time in us) within print rounding."""
    t, a = float(t_txt), float(a_txt)
    dt = half_ulp(t_txt)
    lo, hi = size / (t + dt) / 1e3, size / max(t - dt, 1e-12) / 1e3
    tol = half_ulp(a_txt) + 1e-9
    return lo - tol <= a <= hi + tol, size / t / 1e3


def check_busbw(f, a_txt, b_txt):
    a, b = float(a_txt), float(b_txt)
    tol = half_ulp(a_txt) * f + half_ulp(b_txt) + 1e-9
    return abs(b - a * f) <= tol, a * f


def is_num(v, integer):
    try:
        int(v) if integer else float(v)
        return True
    except ValueError:
        return False


def check_file(path):
    name = os.path.basename(path)
    errors = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        expected = LEGACY.get(name, SCHEMA)
        if header != expected:
            return ["%s: header %r differs from expected %r" % (name, header, expected)], 0
        n_rows = 0
        for i, row in enumerate(reader, start=2):
            n_rows += 1
            where = "%s line %d" % (name, i)
            for col, v in row.items():
                if v is None:
                    errors.append("%s: too few cells" % where)
                    continue
                if v.strip() == "" or name in FREE_TEXT:
                    continue
                if col in INT_COLS and not is_num(v, True):
                    errors.append("%s: %s=%r is not an integer" % (where, col, v))
                if col in FLOAT_COLS and not is_num(v, False):
                    errors.append("%s: %s=%r is not a number" % (where, col, v))
            if name not in LEGACY:
                for col in REQUIRED:
                    if not row[col].strip():
                        errors.append("%s: %s is empty" % (where, col))
                if row["transcription"] not in TRANSCRIPTIONS:
                    errors.append("%s: transcription=%r" % (where, row["transcription"]))
                if "nccl_%s.csv" % row["source_id"] != name:
                    errors.append("%s: source_id %r does not match file name" % (where, row["source_id"]))
                if not any(row[c].strip() for c in ("oop_busbw_GBps", "ip_busbw_GBps",
                                                    "oop_time_us", "ip_time_us")):
                    errors.append("%s: no measurement in row" % where)
            if errors and len(errors) > 50:
                break
            # bandwidth identities
            if name == "stas00_mlengineering_collective_measurements.csv":
                pairs = [("time_us", "algbw_GBps", "busbw_GBps")]
                n_txt = None
                if row["gpus_per_node"].strip() and row["nodes"].strip():
                    n_txt = int(row["gpus_per_node"]) * int(row["nodes"])
            elif name in LEGACY and name != "nccl_tests_measurements.csv":
                continue
            else:
                pairs = [("oop_time_us", "oop_algbw_GBps", "oop_busbw_GBps"),
                         ("ip_time_us", "ip_algbw_GBps", "ip_busbw_GBps")]
                n_txt = int(row["total_ranks"]) if row["total_ranks"].strip() else None
            size = int(row["size_bytes"])
            for tcol, acol, bcol in pairs:
                t, a, b = row[tcol].strip(), row[acol].strip(), row[bcol].strip()
                if t and a:
                    ok, want = check_algbw(size, t, a)
                    if not ok:
                        errors.append("%s: %s=%s but size/time=%.4f" % (where, acol, a, want))
                if a and b:
                    if n_txt is None:
                        errors.append("%s: busbw given but rank count unknown" % where)
                        continue
                    ok, want = check_busbw(factor(row["collective"], n_txt), a, b)
                    if not ok:
                        errors.append("%s: %s=%s but algbw*factor=%.4f" % (where, bcol, b, want))
    return errors, n_rows


def main():
    files = sorted(glob.glob(os.path.join(HERE, "*.csv")))
    all_errors = []
    for path in files:
        errors, n = check_file(path)
        status = "ok" if not errors else "%d problem(s)" % len(errors)
        print("%-60s %5d rows  %s" % (os.path.basename(path), n, status))
        all_errors += errors
    for e in all_errors:
        print("  " + e)
    if not files:
        print("no CSV files found")
        return 1
    return 1 if all_errors else 0


if __name__ == "__main__":
    sys.exit(main())
