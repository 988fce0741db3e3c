# The stop program: request a stop and print a confirmed cleanup receipt on stdout.
# Runs on the sandbox's /bin/sh (POSIX, plus ln, mv, cat, readlink, sleep), as
#   /bin/sh -c "<this file>" opencode-tui-stop SESSION_DIR RECEIPT STOP_REQUEST CLAIM PID_FILE \
#       POLLS POLL_S POLLS_PER_S TIMEOUT_WORDS SYNTHETIC_RECEIPT CLAIM_STOP UNCONFIRMED_EXIT
# (core/runtime/supervisor_client.py `stop_script` builds that argv; every name and number is its).
#
# A receipt that already confirms cleanup is printed as is. Otherwise touch STOP_REQUEST and try to
# claim the launch with CLAIM_STOP: winning means no harness ever ran, and a synthetic confirmed
# receipt is written. If the launch won, SIGTERM the supervisor and poll for its receipt POLLS times.
# Exit 0 with the receipt on stdout, or UNCONFIRMED_EXIT when cleanup could not be confirmed (an
# unconfirmed receipt, if any, is still printed).
session_dir=$1 receipt=$2 stop_request=$3 claim=$4 pid_file=$5
polls=$6 poll_s=$7 polls_per_s=$8 timeout_words=$9
synthetic=${10} claim_stop=${11} unconfirmed_exit=${12}
receipt_tmp="$receipt.stop.tmp"

confirmed() {
  [ -f "$receipt" ] || return 1
  case "$(cat "$receipt" 2>/dev/null)" in
    *'"cleanup_confirmed": true'*|*'"cleanup_confirmed":true'*) return 0 ;;
  esac
  return 1
}
unconfirmed() {
  [ -f "$receipt" ] && cat "$receipt"
  echo "opencode-tui stop: $1" >&2
  exit "$unconfirmed_exit"
}
fence() {
  printf '%s\n' "$synthetic" > "$receipt_tmp" && mv -f "$receipt_tmp" "$receipt" && cat "$receipt" && exit 0
  unconfirmed 'the launch is fenced but the receipt could not be written'
}
if confirmed; then cat "$receipt"; exit 0; fi
[ -d "$session_dir" ] || unconfirmed 'the session directory is missing; launch outcome is unknown'
: > "$stop_request" || echo 'opencode-tui stop: cannot create the stop request file' >&2
if ln -s "$claim_stop" "$claim" 2>/dev/null; then fence; fi
if [ "$(readlink "$claim" 2>/dev/null)" = "$claim_stop" ]; then
  # An earlier stop won the claim but did not finish writing its receipt.
  confirmed && { cat "$receipt"; exit 0; }
  fence
fi
i=0
pid=
while :; do
  if confirmed; then cat "$receipt"; exit 0; fi
  if [ -z "$pid" ] && [ -s "$pid_file" ]; then
    read -r pid pidns < "$pid_file" 2>/dev/null || pid=
    case "$pid" in
      ''|*[!0-9]*) pid= ;;
      *)
        if [ "$pidns" != "$(readlink /proc/self/ns/pid 2>/dev/null || echo unknown)" ]; then
          # Another pid namespace: the number names some other process here. The supervisor
          # polls the stop file, so waiting for the receipt is enough.
          pid=foreign
        else
          kill -TERM "$pid" 2>/dev/null
        fi ;;
    esac
  fi
  if [ -n "$pid" ] && [ "$pid" != foreign ] && ! kill -0 "$pid" 2>/dev/null; then
    confirmed && { cat "$receipt"; exit 0; }
    unconfirmed "the supervisor (pid $pid) exited without a confirmed cleanup receipt"
  fi
  [ "$i" -ge "$polls" ] && break
  # Fractional sleep is not POSIX; where it fails, count a one-second sleep as that many polls.
  if sleep "$poll_s" 2>/dev/null; then i=$((i + 1))
  else sleep 1; i=$((i + polls_per_s)); fi
done
unconfirmed "no confirmed cleanup receipt within ${timeout_words}s; launch outcome is unknown"
