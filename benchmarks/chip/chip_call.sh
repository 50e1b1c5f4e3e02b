# One call of a chip session, from the repository's root on the lent TPU host:
#   bash benchmarks/chip/chip_call.sh NAME SECONDS COMMAND [ARGS...]
# sources chip_env.sh (TorchTPU installed once a machine; the offline installer and its staged
# parts at .chip/install.sh and /tmp/stage), runs COMMAND in a process group of its own, sends it
# SIGINT after SECONDS (so a tuning run still writes its results; SIGKILL 20 s later), kills
# whatever of the group is left (its trial workers), and archives the files COMMAND wrote under /tmp/runs, and its output,
# into $OUT/NAME.tgz (caches and stored reference outputs left out: files over 16 MiB do not come
# back). Its exit status is the command's, 124 where the limit stopped it. Why a group and not `pkill -f`: a pattern naming the tool also matches the calling shell,
# whose own command line names it (docs/torchtpu.md, the fifth session).
set -u
name=${1:?usage: chip_call.sh NAME SECONDS COMMAND [ARGS...]}
seconds=${2:?usage: chip_call.sh NAME SECONDS COMMAND [ARGS...]}
shift 2
if [ -d /tmp/stage ]; then  # on the chip host (elsewhere the command runs as it is, to try the script)
  # shellcheck source=/dev/null
  source benchmarks/chip/chip_env.sh .chip/install.sh /tmp/stage >/dev/null 2>&1
fi
mkdir -p /tmp/runs "${OUT:-/tmp/out}"
log=/tmp/runs/$name.log
group=/tmp/runs/$name.pgid
# In the foreground (a background job would start with SIGINT ignored, and Python then never sees
# it); setsid makes the command's process the leader of a new group, whose id it writes first.
setsid bash -c 'echo $$ > "$0"; exec timeout -s INT -k 20 "$@"' "$group" "$seconds" "$@" >"$log" 2>&1
status=$?
kill -KILL -- "-$(cat "$group")" 2>/dev/null  # trial workers the command left behind
grep -v "^I0000\|^W0000\|tcmalloc\|UserWarning\|absl::InitializeLog" "$log" | tail -n 60
find /tmp/runs -type f -size -3M ! -path "*torchtpu_cache*" ! -path "*references*" | tar czf "${OUT:-/tmp/out}/$name.tgz" -T - 2>/dev/null
echo "chip_call: $name exited with status $status; archive ${OUT:-/tmp/out}/$name.tgz"
exit "$status"
