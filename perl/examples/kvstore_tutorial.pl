#!/usr/bin/perl
# The KVStore tutorial of AI::MXNet (docs/.../perl/docs/tutorials/kvstore.md), step by step
# with SynKV: the same calls, values as PDL piddles, and the same arrays printed.
#
#   cargo build -p synkv-capi && perl perl/examples/kvstore_tutorial.pl
#
# Shapes: MXNet's shape [2, 3] is a PDL of dims (3, 2); nd(...) below does the reversal.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../SynKV/lib";

use PDL;
use SynKV;

my $shape = [2, 3];
sub nd_ones  { return ones(float, reverse @$shape) }
sub nd_zeros { return zeros(float, reverse @$shape) }

# Prints a piddle as the tutorial shows it: "[\n [2 2 2]\n [2 2 2]\n]".
sub show { my ($pdl) = @_; (my $s = "$pdl") =~ s/^\n+|\n+\z//g; print "$s\n" }

# Initialization
my $kv = SynKV->create('local');
$kv->init(3, nd_ones() * 2);
my $a = nd_zeros();
$kv->pull(3, out => $a);
show($a);

# Push, aggregation, and updater
$kv->push(3, nd_ones() * 8);
$a = nd_zeros();
$kv->pull(3, out => $a);
show($a);

# two devices' values are summed
$kv->push(3, [nd_ones(), nd_ones()]);
$kv->pull(3, out => $a);
show($a);

my $updater = sub { my ($key, $input, $stored) = @_; print "update on key: $key\n"; $stored += $input * 3; };
$kv->_set_updater($updater);
$kv->push(3, [nd_ones(), nd_ones()]);
$kv->pull(3, out => $a);
show($a);

# Pull into several outputs
my $b = [nd_zeros(), nd_zeros()];
$kv->pull(3, out => $b);
show($b->[1]);

# List key-value pairs
my $keys = [5, 7, 9];
$kv->init($keys, [map { nd_ones() } 0 .. @$keys - 1]);
$kv->push($keys, [map { nd_ones() } 0 .. @$keys - 1]);
$b = [map { nd_ones() } 0 .. @$keys - 1];
$kv->pull($keys, out => $b);
show($b->[1]);
