#!/usr/bin/env bash
# Runs the agent's fuzz targets for a bounded time each, one at a time (one libFuzzer process), from the
# committed seed corpus plus a scratch corpus under target/ (the committed one is never written), and
# prints a summary: executions, executions/s, coverage (libFuzzer's `cov` edges and `ft` features).
# Usage: run.sh SECONDS [TARGET...]   (all targets by default). Needs `cargo fuzz` on PATH and nightly.
set -uo pipefail
cd "$(dirname "$0")"

seconds=${1:-60}
shift || true
all=(exec_request process_request patch_parse patch_apply patch_tree file_paths cli_args)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

options_for() {
    case $1 in
        exec_request | process_request) echo "-max_len=4096 -dict=dict/json.dict" ;;
        patch_parse) echo "-max_len=4096 -dict=dict/patch.dict" ;;
        patch_tree) echo "-max_len=2048 -dict=dict/patch.dict" ;;
        patch_apply) echo "-max_len=1024" ;;
        file_paths) echo "-max_len=256 -dict=dict/paths.dict" ;;
        cli_args) echo "-max_len=512" ;;
        *) echo "unknown fuzz target $1" >&2; exit 2 ;;
    esac
}

# The fuzz crate always builds into its own target/ (sanitizer flags would churn any shared one).
unset CARGO_TARGET_DIR
cargo +nightly fuzz build -a || exit 1
mkdir -p target/fuzz-logs
failed=()
summary=()
for target in "${targets[@]}"; do
    scratch=target/fuzz-corpus/$target
    mkdir -p "$scratch" "corpus/$target"
    log=target/fuzz-logs/$target.log
    echo "== $target: ${seconds}s"
    # shellcheck disable=SC2046
    if ! cargo +nightly fuzz run -a "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        $(options_for "$target") >"$log" 2>&1; then
        failed+=("$target")
        grep -E "panicked|ERROR|SUMMARY|Test unit written|assert" "$log" | head -20
    fi
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corpus=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
    summary+=("$(printf '%-16s %6ss %12s %9s %7s %7s %12s' "$target" "$seconds" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corpus:-?}")")
done
echo
printf '%-16s %7s %12s %9s %7s %7s %12s\n' target time execs execs/s cov ft corpus
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: failures in ${failed[*]} (logs in agent/fuzz/target/fuzz-logs, inputs in agent/fuzz/artifacts)" >&2
    exit 1
fi
