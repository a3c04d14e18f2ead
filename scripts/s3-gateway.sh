#!/usr/bin/env bash
# s3-gateway.sh: the project's own S3 server for the object-storage tests. A one-node Ceph
# (one mon, one OSD with its objects in RAM, no mgr, no cephx) with radosgw in front, all from
# Debian's packages (scripts/install-deps.sh), listening on 127.0.0.1 only.
#
#   s3-gateway.sh start   bring it up (a running one is reused), print its endpoint and keys
#   s3-gateway.sh env     print the endpoint and keys of the running one (exit 1 if none)
#   s3-gateway.sh status  its daemons, running or not
#   s3-gateway.sh stop    stop the daemons it recorded, only those, and remove its directory
#
# The endpoint and keys are printed on stdout as shell assignments (AWS_ENDPOINT_URL=...,
# AWS_ACCESS_KEY_ID=..., AWS_SECRET_ACCESS_KEY=..., AWS_REGION=...), for `eval`; the log goes
# to stderr. Everything lives in one directory that the script owns ($CKPT_S3_GATEWAY_DIR,
# default /tmp/ckpt-s3-gateway-$UID): the Ceph config, the mon's store, logs, and one PID file
# per daemon. `stop` kills a recorded PID only while that process's command line still names
# this directory's ceph.conf (no stray kill after a PID was reused).
#
# Settings (environment):
#   CKPT_S3_GATEWAY_DIR       its directory (above)
#   CKPT_S3_GATEWAY_PORT      the S3 port on 127.0.0.1 (default: the first free from 7480)
#   CKPT_S3_GATEWAY_MON_PORT  the mon's port on 127.0.0.1 (default: the first free from 3300)
#   CKPT_S3_GATEWAY_MEM_MIB   the most the OSD's RAM store holds (default 2048; tests use MiBs)
#   CKPT_S3_GATEWAY_ADMIN_SOCKET=1  give each daemon an admin socket, $DIR/run/<name>.asok
#                             (`ceph --admin-daemon ... perf dump`: bench/s3.sh counts requests
#                             and bytes there); off by default
#
# Ceph 16 without cephx: every client must be told the "crc" connection mode, or radosgw asks
# the mon for a secure session and retries forever ("get_initial_auth_request returned -13").
set -euo pipefail

DIR=${CKPT_S3_GATEWAY_DIR:-/tmp/ckpt-s3-gateway-$(id -u)}
CONF=$DIR/ceph.conf
ACCESS_KEY=CKPTGATEWAYACCESSKEY
SECRET_KEY=ckpt-gateway-test-secret-0000000000000000
MEM_MIB=${CKPT_S3_GATEWAY_MEM_MIB:-2048}
DAEMONS=(mon osd rgw)

log() { printf '[s3-gateway %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
ceph_cli() { timeout 20 ceph -c "$CONF" --connect-timeout 10 "$@"; }

# The PID recorded for a daemon, if that process is alive and is still this directory's.
live_pid() {  # name
  local f=$DIR/pids/$1 pid
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-c $CONF " || return 1
  echo "$pid"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {  # first
  local p=$1
  while port_in_use "$p"; do
    p=$((p + 1))
    ((p < $1 + 200)) || die "no free port from $1"
  done
  echo "$p"
}

endpoint() { echo "http://127.0.0.1:$(<"$DIR/port")"; }
answers() { curl -fsS -m 2 -o /dev/null "$(endpoint)/"; }

print_env() {
  cat <<EOF
AWS_ENDPOINT_URL=$(endpoint)
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=us-east-1
EOF
}

# Starts a daemon in the foreground mode as a background process in its own session (so a
# terminal's signals do not reach it) and records its PID.
spawn() {  # name command...
  local name=$1; shift
  setsid "$@" -f </dev/null >>"$DIR/log/$name.out" 2>&1 &
  echo $! >"$DIR/pids/$name"
}

wait_until() {  # seconds what command...
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || die "no $what after $secs s; logs: $DIR/log"
    sleep 0.2
  done
}

write_conf() {  # fsid mon_port port
  cat >"$CONF" <<EOF
# written by scripts/s3-gateway.sh: one node, 127.0.0.1 only, no authentication, RAM store
[global]
fsid = $1
mon_host = v2:127.0.0.1:$2
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
ms_client_mode = crc
ms_mon_service_mode = crc
ms_mon_cluster_mode = crc
ms_service_mode = crc
ms_cluster_mode = crc
run_dir = $DIR/run
admin_socket = $(if [[ ${CKPT_S3_GATEWAY_ADMIN_SOCKET:-0} == 1 ]]; then echo "$DIR/run/\$name.asok"; fi)
pid_file =
log_file = $DIR/log/\$name.log
log_to_stderr = false
err_to_stderr = true
mon_cluster_log_file = $DIR/log/cluster.log
crash_dir = $DIR/crash
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 4
osd_pool_default_pgp_num = 4
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
paxos_propose_interval = 0.05
[mon]
mon_data = $DIR/mon
[osd]
osd_data = $DIR/osd
osd_objectstore = memstore
memstore_device_bytes = $((MEM_MIB << 20))
[client.rgw.gateway]
rgw_data = $DIR/rgw
rgw_frontends = beast endpoint=127.0.0.1:$3
rgw_thread_pool_size = 32
# virtual-hosted requests name the bucket in the host: <bucket>.localhost (curl resolves *.localhost)
rgw_dns_name = localhost
# deleted objects' data goes at once (the default waits 2 h, and the RAM store would hold it)
rgw_gc_obj_min_wait = 1
rgw_gc_processor_period = 5
rgw_gc_processor_max_time = 5
EOF
}

start() {
  for c in ceph-mon ceph-osd radosgw ceph radosgw-admin monmaptool uuidgen curl; do
    command -v "$c" >/dev/null || die "$c not found: run scripts/install-deps.sh (Debian: ceph-mon ceph-osd radosgw ceph-common)"
  done
  if [[ -s $DIR/port ]] && live_pid mon >/dev/null && live_pid osd >/dev/null && live_pid rgw >/dev/null && answers; then
    log "already running at $(endpoint)"
    print_env
    return
  fi
  stop_recorded
  remove_dir
  mkdir -p "$DIR"/{run,log,crash,rgw,pids,osd}
  local t0=$EPOCHREALTIME mon_port port fsid
  mon_port=${CKPT_S3_GATEWAY_MON_PORT:-$(free_port 3300)}
  port=${CKPT_S3_GATEWAY_PORT:-$(free_port 7480)}
  port_in_use "$port" && die "port $port on 127.0.0.1 is taken"
  echo "$port" >"$DIR/port"
  fsid=$(uuidgen)
  write_conf "$fsid" "$mon_port" "$port"
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" >>"$DIR/log/mon-mkfs.out" 2>&1 ||
    die "ceph-mon --mkfs failed: $DIR/log/mon-mkfs.out"
  spawn mon ceph-mon -c "$CONF" -i a
  wait_until 30 "mon" ceph_cli mon stat
  local uuid id
  uuid=$(uuidgen)
  id=$(ceph_cli osd new "$uuid")
  [[ $id == 0 ]] || die "expected OSD id 0, got '$id'"
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >>"$DIR/log/osd-mkfs.out" 2>&1 ||
    die "ceph-osd --mkfs failed: $DIR/log/osd-mkfs.out"
  spawn osd ceph-osd -c "$CONF" -i 0
  wait_until 60 "osd.0 up" bash -c "timeout 20 ceph -c '$CONF' --connect-timeout 10 osd dump | grep -q '^osd\.0 up'"
  spawn rgw radosgw -c "$CONF" -n client.rgw.gateway
  wait_until 90 "radosgw answering on $(endpoint)" answers
  radosgw-admin -c "$CONF" user create --uid=ckpt --display-name="ckpt tests" \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null 2>>"$DIR/log/user.out" ||
    die "radosgw-admin user create failed: $DIR/log/user.out"
  local ms=$(((${EPOCHREALTIME/./} - ${t0/./}) / 1000))
  log "up at $(endpoint) in $((ms / 1000)).$((ms % 1000 / 100)) s"
  print_env
}

# Stops the recorded daemons: SIGTERM to all three at once (their data is in RAM and goes
# anyway), then SIGKILL to any still running after 10 s.
stop_recorded() {
  [[ -d $DIR/pids ]] || return 0
  local name pid pids=()
  for name in rgw osd mon; do
    if pid=$(live_pid "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$name:$pid")
    fi
  done
  local end=$((SECONDS + 10)) entry
  for entry in "${pids[@]}"; do
    name=${entry%%:*} pid=${entry#*:}
    while [[ -d /proc/$pid ]] && live_pid "$name" >/dev/null && ((SECONDS < end)); do sleep 0.1; done
    if live_pid "$name" >/dev/null; then
      log "$name (pid $pid) is still running after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  done
  rm -f "$DIR"/pids/*
}

# Removes the directory only if it is this script's (its ceph.conf says so) or empty: a
# mistyped CKPT_S3_GATEWAY_DIR never loses someone's files.
remove_dir() {
  [[ -e $DIR ]] || return 0
  if [[ -f $CONF ]] && head -1 "$CONF" | grep -qF 'written by scripts/s3-gateway.sh'; then
    rm -rf "$DIR"
  else
    rmdir "$DIR" 2>/dev/null || die "$DIR exists and is not this script's directory"
  fi
}

status() {
  local name pid rc=0
  for name in "${DAEMONS[@]}"; do
    if pid=$(live_pid "$name"); then
      echo "$name: pid $pid, $(awk '/VmRSS/ {print $2 " kB RSS"}' "/proc/$pid/status")"
    else
      echo "$name: not running"; rc=1
    fi
  done
  return $rc
}

case ${1:-} in
  start) start ;;
  env) { [[ -s $DIR/port ]] && live_pid rgw >/dev/null; } || die "not running ($DIR)"; print_env ;;
  status) status ;;
  stop) stop_recorded; remove_dir ;;
  *) die "usage: $0 start|stop|env|status" ;;
esac
