#!/usr/bin/env bash
# Makes the peers environment: a scratch virtual environment of the machine's python3 with the
# projects zinf is compared with and must stay compatible with (torch, DeepSpeed, transformers),
# never a dependency of zinf itself. Then checks that DeepSpeed's own ops build and run there on
# the CPU accelerator (scripts/peers_check.py: AsyncIOBuilder().load() with one aio write and
# read back byte for byte, CPUAdamBuilder().load() with one DeepSpeedCPUAdam step against torch's
# AdamW). DeepSpeed builds its ops just in time with its own flags (ninja, the machine's g++,
# Debian's libaio-dev for the aio op, installed here when root). Not part of CI (minutes of
# downloads and op builds; docs/python.md, "The peers environment").
# Usage: scripts/peers.sh [VENV (./peers-venv)]
set -euo pipefail
venv=${1:-peers-venv}
here=$(cd "$(dirname "$0")" && pwd)

# Pinned, so the environment is the same on every run: torch exactly 2.13.0 (the machine holds
# its CPU wheel; an open range downloads a CUDA build of several GB), the newest DeepSpeed 0.19
# and the last transformers 4.x (DeepSpeed's integration there is what trainers use today).
torch_pin=torch==2.13.0
deepspeed_pin=deepspeed==0.19.8
transformers_pin=transformers==4.57.6

if ! dpkg-query -W -f='${Status}' libaio-dev 2>/dev/null | grep -q "install ok installed"; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "peers: installing libaio-dev (DeepSpeed's aio op links libaio)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libaio-dev >/dev/null
  else
    echo "peers: libaio-dev is not installed and this is not root: DeepSpeed's aio op will" \
         "not build (apt-get install libaio-dev)" >&2
  fi
fi

start=$SECONDS
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# torch first and alone, so that nothing after it can pick another torch.
"$venv/bin/pip" install --quiet "$torch_pin"
# DeepSpeed comes as source: built without torch in its isolated build environment, it compiles
# no op at install time (each is built just in time by its builder's load()).
DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "$venv/bin/pip" install --quiet "$deepspeed_pin" \
  "$transformers_pin" "$torch_pin"
echo "peers: $venv installed in $((SECONDS - start)) s:"
"$venv/bin/pip" list 2>/dev/null | grep -iE '^(torch|deepspeed|transformers|ninja) '

start=$SECONDS
venv_abs=$(cd "$venv" && pwd)
DS_ACCELERATOR=cpu "$venv/bin/python" "$here/peers_check.py" "$venv_abs"
echo "peers: the check took $((SECONDS - start)) s"
