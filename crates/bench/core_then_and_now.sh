#!/usr/bin/env bash
# The core row, today's core against an older commit's, on one op sequence.
#
#   crates/bench/core_then_and_now.sh COMMIT [--old-contract | --unscoped] [ROUNDS]
#
# Builds `then/harness.rs` (with the workload generator of today's
# crates/core/benches/support/workload.rs copied in) against the settle-core
# of COMMIT (a temporary worktree) and against this checkout's, both in
# release with mimalloc, then prints each side's instructions (callgrind,
# when valgrind is there) and user CPU seconds over five interleaved runs.
# `--old-contract` feeds COMMIT the ops as the contract before WorkIds spelled
# them (for commits before that change, e.g. 1997241); `--unscoped` feeds it
# registrations without a scope (for commits before scopes).
set -euo pipefail
commit=${1:?usage: core_then_and_now.sh COMMIT [--old-contract | --unscoped] [ROUNDS]}
shift
old_features=""
if [[ "${1:-}" == "--old-contract" ]]; then old_features="old_contract"; shift; fi
if [[ "${1:-}" == "--unscoped" ]]; then old_features="unscoped"; shift; fi
rounds=${1:-40}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/tree" "$commit" >/dev/null
workload="$root/crates/core/benches/support/workload.rs"
for side in then now; do
  core="$root/crates/core"; features=""
  if [[ $side == then ]]; then core="$work/tree/crates/core"; features="$old_features"; fi
  mkdir -p "$work/$side/src"
  {
    sed -n '1,/^\/\/ The generator of/p' "$root/crates/bench/then/harness.rs" | sed '$d'
    sed -n '/^\/\/\/ splitmix64/,/^\/\/\/ The policy of both/p' "$workload" | sed '$d'
    sed -n '/^\/\/ The generator of/,$p' "$root/crates/bench/then/harness.rs" | sed '1,2d'
  } > "$work/$side/src/main.rs"
  cat > "$work/$side/Cargo.toml" <<TOML
[package]
name = "core-$side"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
settle-core = { path = "$core" }
mimalloc = { version = "0.1", default-features = false }
[features]
old_contract = []
unscoped = []
[profile.release]
debug = 1
[workspace]
TOML
  cp "$root/Cargo.lock" "$work/$side/" 2>/dev/null || true
  (cd "$work/$side" && cargo build --release --quiet ${features:+--features "$features"})
done
bin() { echo "$work/$1/target/release/core-$1"; }
echo "applied / refused inputs per round:"
for side in then now; do echo "  $side: $("$(bin $side)" 1 2>&1 | tail -1)"; done
if command -v valgrind >/dev/null; then
  echo "instructions, 3 rounds (callgrind):"
  for side in then now; do
    n=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$(bin $side)" 3 2>&1 | sed -n 's/.*Collected : //p')
    echo "  $side: $n"
  done
fi
echo "user CPU seconds, $rounds rounds, five interleaved runs:"
for side in then now; do : > "$work/$side.cpu"; done
for _ in 1 2 3 4 5; do
  for side in then now; do
    /usr/bin/time -f "%U" -a -o "$work/$side.cpu" "$(bin $side)" "$rounds" 2>/dev/null
  done
done
for side in then now; do echo "  $side: $(tr '\n' ' ' < "$work/$side.cpu")"; done
