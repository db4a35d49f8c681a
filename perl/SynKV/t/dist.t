# SynKV against a distributed store: t/dist_worker.pl runs as both workers of a real job,
# `synkv launch -n 2 -s 2 --launcher local` on 127.0.0.1, once with int keys and once with str
# keys, and checks rank, worker count, type and the pulled sums with assign, the Test
# optimizer and SGD (numbers in dist_worker.pl). Each job is bounded by a timeout.
#
# The synkv executable: $SYNKV_BIN, else `synkv` next to the library SynKV loads (cargo puts
# both in target/<profile>). scripts/test-perl.sh builds it and sets SYNKV_BIN. Without one the
# test is skipped, with the reason — except under CI (CI set), where that is a failure.
use strict;
use warnings;
use Test::More;
use FindBin;
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use lib "$FindBin::Bin/../lib";

use SynKV;

my $TIMEOUT = 180;    # seconds per job

my $synkv = $ENV{SYNKV_BIN} || dirname(SynKV::FFI::library_path()) . '/synkv';
if (!-x $synkv) {
    my $why = $ENV{SYNKV_BIN}
        ? "SYNKV_BIN=$ENV{SYNKV_BIN} is not an executable"
        : "the synkv executable is not next to the library ($synkv)";
    my $fix = 'build it with `cargo build -p synkv-cli` or set SYNKV_BIN (scripts/test-perl.sh does both)';
    if ($ENV{SYNKV_BIN} || $ENV{CI}) {
        fail("$why; $fix");
        done_testing();
        exit;
    }
    plan skip_all => "$why; $fix";
}

# The workers load the same library as this test; short heartbeats so a failure ends quickly.
$ENV{SYNKV_LIB} = SynKV::FFI::library_path();
$ENV{SYNKV_HEARTBEAT_INTERVAL_MS} = 200;
$ENV{SYNKV_HEARTBEAT_TIMEOUT_MS}  = 2000;
$ENV{SYNKV_TIMEOUT_MS}            = 30000;
$ENV{SYNKV_LOG}                   = 'warn';
delete @ENV{qw(DMLC_ROLE DMLC_PS_ROOT_URI DMLC_PS_ROOT_PORT DMLC_NUM_SERVER DMLC_NUM_WORKER DMLC_TASK_ID SYNKV_SECRET)};

# Runs @cmd with stdout and stderr together; SIGTERM after $TIMEOUT s (the launcher then stops
# every process), SIGKILL 10 s later. Returns (exit status, output, timed out).
sub run_bounded {
    my @cmd = @_;
    my $pid = open(my $fh, '-|');
    die "cannot fork: $!" unless defined $pid;
    if (!$pid) {
        open(STDERR, '>&', \*STDOUT) or die "cannot redirect stderr: $!";
        exec { $cmd[0] } @cmd or do { print "cannot run $cmd[0]: $!\n"; exit 127 };
    }
    my ($output, $timed_out) = ('', 0);
    local $SIG{ALRM} = sub {
        $timed_out++;
        kill($timed_out == 1 ? 'TERM' : 'KILL', $pid);
        alarm 10;
    };
    alarm $TIMEOUT;
    while (my $line = <$fh>) { $output .= $line }
    close $fh;
    my $status = $?;
    alarm 0;
    return ($status, $output, $timed_out);
}

for my $kind (qw(int str)) {
    subtest "a Perl worker with $kind keys runs a dist_sync job under synkv launch" => sub {
        my @cmd = ($synkv, qw(launch -n 2 -s 2 --launcher local --grace-secs 5 --), $^X, "$FindBin::Bin/dist_worker.pl", $kind);
        my $ckpt = tempdir(CLEANUP => 1);
        local $ENV{DIST_PERL_CHECKPOINT_DIR} = $ckpt;
        my ($status, $output, $timed_out) = run_bounded(@cmd);
        ok(!$timed_out, "finished within $TIMEOUT s") or diag($output);
        is($status >> 8, 0, 'the launcher exits 0') or diag($output);
        for my $w (0, 1) {
            like($output, qr/^\[worker $w\] dist_worker $kind ok \(rank $w of 2 workers\)$/m, "worker $w passed its checks");
        }
        for my $label ('scheduler', 'server 0', 'server 1') {
            like($output, qr/^\[launch\] \Q$label\E exited successfully$/m, "$label exited cleanly");
        }
        unlike($output, qr/FAIL/, 'no failed check');
        ok(-f "$ckpt/MANIFEST.json", 'the checkpoint has a manifest') or diag($output);
        ok(-d "$ckpt/ckpt-00000001", 'the checkpoint has its directory of shards');
    };
}

done_testing();
