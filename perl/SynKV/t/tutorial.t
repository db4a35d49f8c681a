# perl/examples/kvstore_tutorial.pl prints the arrays of AI::MXNet's KVStore tutorial.
use strict;
use warnings;
use Test::More tests => 2;
use FindBin;

my $script = "$FindBin::Bin/../../examples/kvstore_tutorial.pl";
my $output = `$^X $script 2>&1`;
is($?, 0, 'the tutorial runs') or diag($output);

sub block { my ($v) = @_; return "[\n [$v $v $v]\n [$v $v $v]\n]\n" }
my $expected = join '', block(2), block(8), block(2), "update on key: 3\n", block(8), block(8),
    "update on key: 5\nupdate on key: 7\nupdate on key: 9\n", block(4);
is($output, $expected, 'it prints the tutorial arrays');
