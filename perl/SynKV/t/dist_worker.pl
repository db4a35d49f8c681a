#!/usr/bin/env perl
# A worker of a dist_sync job, run by t/dist.t under `synkv launch -n 2 -s 2` (not a test file
# itself: prove runs only *.t). Usage: dist_worker.pl int|str — the kind of keys (a store holds
# one kind). The same checks as crates/synkv-capi/examples/c/dist_capi.c, with PDL piddles:
# rank, worker count and type; then a 2x3 key and a 1200x1200 key (split over the servers)
# get ones * (rank + 1) pushed twice and pulled after each push:
#   - no optimizer: the sum over workers, n(n+1)/2;
#   - the Test optimizer with rescale_grad 2: 1 + 2 * n(n+1)/2 * round;
#   - SGD with learning rate 0.1: 1 - 0.1 * n(n+1)/2 * round;
# with a barrier between the phases, then a checkpoint when DIST_PERL_CHECKPOINT_DIR is set. Prints "dist_worker KIND ok (rank r of n workers)" or one
# "FAIL ..." line per failed check, and exits non-zero on a failure.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";

use PDL;
use SynKV;

my $kind = shift // '';
die "usage: $0 int|str (run it under synkv launch)\n" unless $kind eq 'int' || $kind eq 'str';

my @failed;
sub check {
    my ($ok, $what) = @_;
    CORE::push @failed, $what unless $ok;
}

my $kv = SynKV->create('dist_sync');
my ($rank, $n) = ($kv->rank, $kv->num_workers);
check($kv->type eq 'dist_sync', "type is " . $kv->type);
check(defined $ENV{DMLC_NUM_WORKER} && $n == $ENV{DMLC_NUM_WORKER}, "num_workers $n, DMLC_NUM_WORKER " . ($ENV{DMLC_NUM_WORKER} // 'unset'));
check(defined $ENV{DMLC_TASK_ID} && $rank == $ENV{DMLC_TASK_ID}, "rank $rank, DMLC_TASK_ID " . ($ENV{DMLC_TASK_ID} // 'unset'));

my $tri = $n * ($n + 1) / 2;
my @phases = (
    ['assign',         undef,                          0, sub { $tri }],
    ['test optimizer', ['test', rescale_grad => 2],    1, sub { 1 + 2 * $tri * $_[0] }],
    ['sgd',            ['sgd', learning_rate => 0.1],  1, sub { 1 - 0.1 * $tri * $_[0] }],
);
my @dims = ([3, 2], [1200, 1200]);    # PDL dims are reversed: shapes (2, 3) and (1200, 1200)
for my $p (0 .. $#phases) {
    my ($name, $optimizer, $init, $expect) = @{ $phases[$p] };
    my $keys = $kind eq 'int' ? [3 + 2 * $p, 99 + $p] : ["w$p", "big_w$p"];
    $kv->set_optimizer(@$optimizer) if $optimizer;
    $kv->init($keys, [map { zeros(float, @$_) + $init } @dims]);
    for my $round (1, 2) {
        $kv->push($keys, [map { ones(float, @$_) * ($rank + 1) } @dims]);
        my @outs = map { zeros(float, @$_) - 1 } @dims;
        $kv->pull($keys, out => \@outs);
        $kv->wait_all;
        my $want = $expect->($round);
        for my $i (0 .. $#outs) {
            my $dev = ($outs[$i] - $want)->abs->max;
            my $tol = 1e-5 * ($want > 1 || $want < -1 ? abs $want : 1);
            check($dev <= $tol, "$name, round $round, key $keys->[$i]: off by $dev from $want");
        }
    }
    $kv->barrier;
}
# A checkpoint of the servers when the test asks for one (DIST_PERL_CHECKPOINT_DIR): a
# collective call, after 6 push calls (3 phases of 2 rounds); a fresh job resumed from none.
check(!defined $kv->resumed_round, 'a fresh job has no resumed round');
if (my $dir = $ENV{DIST_PERL_CHECKPOINT_DIR}) {
    my ($id, $round) = $kv->checkpoint($dir);
    check($id >= 1, "checkpoint id $id");
    check($round == 6, "checkpoint round $round, want 6");
}
# Closes the store: waits until every worker is done, then the servers exit.
undef $kv;

print "FAIL rank $rank: $_\n" for @failed;
print "dist_worker $kind ok (rank $rank of $n workers)\n" unless @failed;
exit(@failed ? 1 : 0);
