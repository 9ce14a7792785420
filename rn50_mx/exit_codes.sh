# shellcheck shell=bash
# The exit codes of a training run's outcomes, stated once: run_and_time.sh and trials.sh source this file, and
# rn50_mx/exits.py reads it for training and the tools. Success is 0; a run that ended without reaching the target
# (run_stop aborted after its last eval) makes training exit 0 and run_and_time.sh exit MISSED_EXIT; a failure is
# its own code (2: bad input, one line).
MISSED_EXIT=1      # the target was not reached: a trial that did not converge (run_and_time.sh)
RESUMABLE_EXIT=75  # stopped after writing a checkpoint (SIGTERM/SIGUSR1), to be resumed (EX_TEMPFAIL)
DIVERGED_EXIT=78   # the loss diverged (NaN, infinite, or past any a learning run has): a finding about the settings
                   # that set the step size (EX_CONFIG); no checkpoint of that state is written
STALLED_EXIT=79    # a rank made no progress for longer than the run's bound (the progress watchdog, issue 48): its
                   # log holds `stalled` then run_stop aborted; the last checkpoint, if any, stays the resume point
