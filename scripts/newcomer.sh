#!/usr/bin/env bash
# Do what the README and the Get-started pages tell a newcomer, in their order and as written: make the venv and run
# the demo, record and compile the csv_report routine and run it, run the framework examples, build
# the WASM tools, and run the offline agent and cache examples. Stops at the first step that does
# not behave as the README says. Everything it writes is ignored by git (.engrain/, out/, tools/):
# CI (.ci/run) runs it on a clean checkout and then checks that `git status` is still clean.
#
# Usage: scripts/newcomer.sh        (from anywhere; it works in the repository's root)
# Env:   VENV  the venv to make and use (default .venv, the README's; another path tries the
#              steps without touching yours).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}

step() { printf '\n== %s\n' "$*"; }
die() { printf 'newcomer.sh: %s\n' "$*" >&2; exit 1; }
# Run a command that the README says exits with a given code.
expect_exit() {
  local want=$1 got=0
  shift
  "$@" || got=$?
  [ "$got" = "$want" ] || die "'$*' exited $got, the README says $want"
}

step "Set up: python3 -m venv $venv && $venv/bin/pip install -e . && $venv/bin/engrain demo"
mkdir -p out
python3 -m venv "$venv" && "$venv/bin/pip" install -e . && "$venv/bin/engrain" demo | tee out/demo.log
# The commands the demo ends with must work as printed (`engrain serve` is left to the tests).
. "$venv/bin/activate"
mapfile -t next < <(sed -n 's/^  \(engrain \(runs\|show\) [^#]*[^ #]\).*$/\1/p' out/demo.log)
[ ${#next[@]} -ge 2 ] || die "the demo did not end with the 'engrain runs' and 'engrain show' commands to try next"
for cmd in "${next[@]}"; do
  step "The demo's next command: $cmd"
  out=$(eval "$cmd") || die "'$cmd' failed"
  [ -n "$out" ] || die "'$cmd' printed nothing"
  head -5 <<< "$out"
done

step "Routines: python examples/csv_report/agent.py, then validate, run, resume, compile"
python examples/csv_report/agent.py
engrain validate out/csv_report/routine --tools examples/csv_report/agent.py:tools
log=out/csv_report/run.log
expect_exit 3 engrain run out/csv_report/routine --input out/csv_report/routine/input.json \
  --tools examples/csv_report/agent.py:tools > "$log"
cat "$log"
run_id=$(sed -n 's/^answer with: engrain resume \([^ ]*\) .*/\1/p' "$log")
[ -n "$run_id" ] || die "engrain run did not say how to resume the run"
echo '{"approved": "yes"}' > out/csv_report/answers.json
engrain resume "$run_id" --answers out/csv_report/answers.json --tools examples/csv_report/agent.py:tools
engrain export "$run_id" > out/csv_report/exported.json
engrain compile out/csv_report/exported.json -o out/my_routine

step "Behavior cache: python examples/cache/agent.py"
python examples/cache/agent.py

step "LangGraph and the OpenAI Agents SDK: pip install -e '.[langgraph,openai-agents]', their examples"
pip install -e '.[langgraph,openai-agents]'
expect_exit 137 python examples/langgraph_agent/agent.py --crash   # killed (SIGKILL) after the tool ran
python examples/langgraph_agent/agent.py --resume                  # continues from the last checkpoint
engrain show langgraph:refund-42 > /dev/null
python examples/openai_agents/agent.py
engrain show refund-7 > /dev/null

step "Sandboxed tools: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32, scripts/build_wasm_tools.sh tools"
if ! command -v clang >/dev/null || [ ! -e /usr/lib/wasm32-wasi/crt1-command.o ]; then
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null
fi
scripts/build_wasm_tools.sh tools
[ -e tools/wordcount.wasm ] && [ -e tools/hostile.wasm ] || die "tools/*.wasm were not built"

step "LLM agents, offline: python examples/agent/agent.py"
python examples/agent/agent.py

step "Done: every step behaved as the README says"
