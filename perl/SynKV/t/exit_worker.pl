#!/usr/bin/env perl
# A worker for t/dist_exit.t (not a test file itself): joins a dist_sync job, pushes and pulls
# one round, prints "exit_worker rank R trained", then sleeps R * SECS and exits WITHOUT calling
# close: SynKV's END block closes the store, and a failure there must be a non-zero exit.
# Usage: exit_worker.pl SECS
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";

use PDL;
use SynKV;

my $secs = shift // 0;
$| = 1;
my $kv = SynKV->create('dist_sync');
my ($rank, $n) = ($kv->rank, $kv->num_workers);
$kv->init(7, zeros(4));
$kv->push(7, ones(4) * ($rank + 1));
my $out = zeros(4);
$kv->pull(7, out => $out);
my $want = $n * ($n + 1) / 2;
die "rank $rank: pulled $out, expected $want\n" unless all($out == $want);
print "exit_worker rank $rank trained\n";
sleep($rank * $secs);
