#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/wattprint.sh, see slurm.conf.example):
# writes the finished job's energy and emissions on this node, read from this node's
# Wattprint exporter, into the job's AdminComment as compact JSON (docs/slurm.md).
#
# slurmd runs it as root with the job's SLURM_JOB_ID once the job's processes are gone.
# It always exits 0: a failing epilog drains the node, and a job's result must not
# depend on its energy figure. What it did, or why it did not, is one line in the log.
#
# Settings (environment, or /etc/default/wattprint-slurm, a shell fragment):
#   WATTPRINT               the wattprint command (default: wattprint on PATH)
#   WATTPRINT_EXPORTER_URL  this node's exporter (default http://127.0.0.1:9950/metrics)
#   WATTPRINT_EPILOG_LOG    where the line goes (default /var/log/slurm/wattprint-epilog.log)
#   WATTPRINT_EPILOG_SUMMARY=1  also append a one-paragraph summary to the job's output
[ -r /etc/default/wattprint-slurm ] && . /etc/default/wattprint-slurm
PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # slurmd gives none
log="${WATTPRINT_EPILOG_LOG:-/var/log/slurm/wattprint-epilog.log}"
export WATTPRINT_EXPORTER_URL WATTPRINT_EPILOG_SUMMARY
"${WATTPRINT:-wattprint}" slurm-epilog >>"$log" 2>&1 </dev/null
exit 0
