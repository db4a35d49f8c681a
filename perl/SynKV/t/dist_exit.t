# A Perl worker whose store cannot close cleanly at exit (the scheduler died while it waited
# for the other worker to finish) exits with status 1 and says why, rather than passing
# silently; a clean close at exit is status 0. A job started role by role on 127.0.0.1.
use strict;
use warnings;
use Test::More;
use FindBin;
use File::Basename qw(dirname);
use IO::Socket::INET;
use POSIX ":sys_wait_h";
use lib "$FindBin::Bin/../lib";

use SynKV;

my $synkv = $ENV{SYNKV_BIN} || dirname(SynKV::FFI::library_path()) . '/synkv';
if (!-x $synkv) {
    if ($ENV{SYNKV_BIN} || $ENV{CI}) {
        fail("the synkv executable is missing ($synkv); build it with `cargo build -p synkv-cli`");
        done_testing();
        exit;
    }
    plan skip_all => "the synkv executable is not built ($synkv)";
}

my $port = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0)->sockport;
$ENV{SYNKV_LIB} = SynKV::FFI::library_path();
$ENV{$_->[0]} = $_->[1] for (
    [SYNKV_HEARTBEAT_INTERVAL_MS => 200], [SYNKV_HEARTBEAT_TIMEOUT_MS => 2000], [SYNKV_TIMEOUT_MS => 30000], [SYNKV_LOG => 'warn'],
    [DMLC_PS_ROOT_URI => '127.0.0.1'], [DMLC_PS_ROOT_PORT => $port], [DMLC_NUM_SERVER => 1], [DMLC_NUM_WORKER => 2],
);
delete $ENV{SYNKV_SECRET};

# Starts @cmd with DMLC_ROLE/DMLC_TASK_ID set, output to $log; returns the pid.
sub start {
    my ($role, $task, $log, @cmd) = @_;
    my $pid = fork() // die "cannot fork: $!";
    if (!$pid) {
        $ENV{DMLC_ROLE} = $role;
        defined $task ? ($ENV{DMLC_TASK_ID} = $task) : delete $ENV{DMLC_TASK_ID};
        open(STDOUT, '>', $log) or die "cannot write $log: $!";
        open(STDERR, '>&', \*STDOUT) or die;
        exec @cmd or die "cannot run $cmd[0]: $!";
    }
    return $pid;
}

sub slurp { my ($f) = @_; open(my $fh, '<', $f) or return ''; local $/; return <$fh> }

# Waits (bounded) for $pid; returns its exit status, or undef if it still runs.
sub wait_exit {
    my ($pid, $secs) = @_;
    for (1 .. $secs * 10) {
        return $? >> 8 if waitpid($pid, WNOHANG) == $pid;
        select(undef, undef, undef, 0.1);
    }
    return undef;
}

my $dir = "/tmp/synkv-dist-exit-$$";
mkdir $dir;
my @pids;
push @pids, my $scheduler = start('scheduler', undef, "$dir/scheduler", $synkv, 'scheduler');
push @pids, start('server', 0, "$dir/server", $synkv, 'server');
push @pids, my $early = start('worker', 0, "$dir/w0", $^X, "$FindBin::Bin/exit_worker.pl", 60);
push @pids, start('worker', 1, "$dir/w1", $^X, "$FindBin::Bin/exit_worker.pl", 60);

my $trained = 0;
for (1 .. 600) {
    last if ($trained = slurp("$dir/w0") =~ /rank 0 trained/);
    select(undef, undef, undef, 0.1);
}
ok($trained, 'worker 0 trained') or diag(slurp("$dir/w0"));
sleep 1;    # worker 0 now waits at exit, in END, for worker 1 to finish
ok(!defined wait_exit($early, 0.2), 'worker 0 waits for the other worker at exit');
kill 'KILL', $scheduler;
my $status = wait_exit($early, 60);
is($status, 1, 'a close that fails at exit is exit status 1');
like(slurp("$dir/w0"), qr/SynKV: (?:error at exit: )?closing the store failed: .*lost scheduler/, 'and says why');

kill 'KILL', @pids;
waitpid($_, 0) for @pids;
system('rm', '-rf', $dir);
done_testing();
