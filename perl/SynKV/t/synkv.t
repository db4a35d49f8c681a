# SynKV beyond the upstream test file: zero-copy outputs, slices, str keys, pushpull,
# broadcast, ignore_sparse, RowSparse round trips, and errors (each croaks with synkv's
# message, which names the key and the fix).
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../lib";

use PDL;
use FFI::Platypus::Buffer qw(scalar_to_buffer);
use File::Temp qw(tempdir);
use SynKV;

sub address { my ($pdl) = @_; my ($ptr) = scalar_to_buffer(${ $pdl->get_dataref }); return $ptr }

subtest 'store info' => sub {
    my $kv = SynKV->create('Device');
    is($kv->type, 'device', 'type is lower-cased');
    is($kv->rank, 0, 'rank');
    is($kv->num_workers, 1, 'num_workers');
    $kv->barrier;
    $kv->_barrier;
    $kv->wait_all;
    pass('barrier and wait_all');
};

subtest 'pull writes the piddle in place (zero-copy)' => sub {
    my $kv = SynKV->create('local');
    $kv->init(3, ones(float, 256, 64) * 5);
    my $out = zeros(float, 256, 64);
    my $before = address($out);
    $kv->pull(3, out => $out, priority => 2);
    is(address($out), $before, 'same data buffer');
    ok(all($out == 5), 'values arrived');
    my $small = zeros(float, 2);
    $kv->init(4, pdl(float, [1, 2]));
    $kv->pull(4, out => $small);
    is_deeply([$small->list], [1, 2], 'small piddles too');
};

subtest 'slices as outputs reach their parent' => sub {
    my $kv = SynKV->create('local');
    $kv->init(3, ones(float, 4, 4) * 7);
    my $big = zeros(float, 4, 8);
    $kv->pull(3, out => $big->slice(':,2:5'));
    is($big->slice(':,2:5')->sum, 7 * 16, 'the slice rows hold the value');
    is($big->sum, 7 * 16, 'the other rows are untouched');
};

subtest 'dtypes convert on pull' => sub {
    my $kv = SynKV->create('local');
    $kv->init(3, pdl(double, [[1.5, 2.5], [3.5, 4.5]]));
    my $out = zeros(float, 2, 2);
    $kv->pull(3, out => $out);
    is_deeply([$out->list], [1.5, 2.5, 3.5, 4.5], 'double into float');
};

subtest 'str keys and the updater key' => sub {
    my $kv = SynKV->create('local');
    $kv->init(['w', 'b'], [zeros(float, 3), zeros(float, 3)]);
    my @seen;
    $kv->set_updater(sub { my ($key, $in, $stored) = @_; push @seen, $key; $stored += $in * 2 });
    $kv->push(['w', 'b'], [ones(float, 3), [ones(float, 3), ones(float, 3)]]);
    my ($w, $b) = (zeros(float, 3), zeros(float, 3));
    $kv->pull(['w', 'b'], out => [$w, $b]);
    is_deeply([$w->list], [2, 2, 2], 'w updated');
    is_deeply([$b->list], [4, 4, 4], 'b got the sum of two devices');
    is_deeply(\@seen, ['w', 'b'], 'str keys in init order');
    my $ikv = SynKV->create('local');
    $ikv->init(3, zeros(float, 2));
    my $key;
    $ikv->set_updater(sub { $key = $_[0] });
    $ikv->push(3, ones(float, 2));
    is($key, 3, 'int keys arrive as integers');
};

subtest 'pushpull and broadcast' => sub {
    my $kv = SynKV->create('local');
    $kv->init(3, zeros(float, 2, 2));
    my ($x, $y) = (ones(float, 2, 2), ones(float, 2, 2));
    $kv->pushpull(3, [$x, $y]);
    ok(all($x == 2) && all($y == 2), 'in place: both values hold the sum');
    my $out = zeros(float, 2, 2);
    $kv->pushpull(3, [$x, $y], out => $out);
    ok(all($out == 4), 'into out');
    my ($p, $q) = (zeros(float, 3), zeros(float, 3));
    $kv->broadcast(6, ones(float, 3), out => [$p, $q]);
    ok(all($p == 1) && all($q == 1), 'broadcast into two outputs');
    eval { $kv->broadcast(6, ones(float, 3), out => $p) };
    like($@, qr/duplicate init of key 6/, 'a key is broadcast once');
};

subtest 'row_sparse values and ignore_sparse' => sub {
    my $kv = SynKV->create('local');
    my $rs = SynKV::RowSparse->new([4, 2], [1, 3], pdl(float, [[1, 2], [3, 4]]));
    is_deeply([$rs->indices->list], [1, 3], 'indices');
    is_deeply([$rs->data->list], [1, 2, 3, 4], 'data');
    is_deeply([$rs->aspdl->list], [0, 0, 1, 2, 0, 0, 3, 4], 'dense copy');
    is_deeply($rs->shape, [4, 2], 'shape');
    $kv->init('d', ones(float, 2, 4) * 2);
    my $out = SynKV::RowSparse->zeros([4, 2]);
    $kv->pull('d', out => $out);
    is($out->indices->nelem, 0, 'skipped by default');
    $kv->pull('d', out => $out, ignore_sparse => 0);
    ok(all($out->aspdl == 2), 'every row with ignore_sparse => 0');
    $kv->init('e', $rs);
    my $pulled = SynKV::RowSparse->zeros([4, 2]);
    $kv->row_sparse_pull('e', out => $pulled, row_ids => [3, 0, 3]);
    is_deeply([$pulled->indices->list], [0, 3], 'rows sorted and de-duplicated');
    is_deeply([$pulled->data->list], [0, 0, 3, 4], 'absent rows are zeros');
    eval { $kv->row_sparse_pull('e', out => zeros(float, 2, 4), row_ids => [0]) };
    like($@, qr/row_sparse/, 'a dense output is refused');
};

subtest 'optimizers and their states' => sub {
    my $kv = SynKV->create('local');
    $kv->init(3, ones(float, 2));
    $kv->set_optimizer('sgd', learning_rate => 0.1, momentum => 0.9);
    my $w = zeros(float, 2);
    $kv->push(3, ones(float, 2));
    $kv->pull(3, out => $w);
    ok(all(abs($w - 0.9) < 1e-6), 'sgd step: 1 - 0.1');
    my $file = tempdir(CLEANUP => 1) . '/states.bin';
    $kv->save_optimizer_states($file);
    $kv->push(3, ones(float, 2));
    $kv->load_optimizer_states($file);
    $kv->push(3, ones(float, 2));
    $kv->pull(3, out => $w);
    ok(all(abs($w - 0.52) < 1e-5), 'momentum restored from the file (0.9 - 0.19 - 0.19)');
    $kv->set_optimizer({name => 'test', common => {rescale_grad => 2}});
    $kv->push(3, ones(float, 2));
    $kv->pull(3, out => $w);
    ok(all(abs($w - 2.52) < 1e-5), 'the test optimizer from a description: w += 2 g');
    eval { $kv->set_optimizer('sgd', momentun => 0.9) };
    like($@, qr/momentun/, 'unknown parameters are rejected');
};

subtest 'errors croak with synkv messages' => sub {
    eval { SynKV->create('foo') };
    like($@, qr/unknown store type `foo`/, 'unknown type');
    my $kv = SynKV->create('local');
    $kv->init(3, zeros(float, 2));
    eval { $kv->pull(4, out => zeros(float, 2)) };
    like($@, qr/key 4 has not been initialised/, 'uninitialised key');
    eval { $kv->init(3, zeros(float, 2)) };
    like($@, qr/duplicate init of key 3/, 'duplicate init');
    eval { $kv->push('a', zeros(float, 2)) };
    like($@, qr/mixed key types are not allowed/, 'mixed key kinds');
    eval { $kv->push([3, 'a'], [zeros(float, 2), zeros(float, 2)]) };
    like($@, qr/inconsistent types of keys/, 'int and str keys in one call');
    eval { $kv->push([3, 4], [zeros(float, 2)]) };
    like($@, qr/2 keys but 1 values/, 'keys and values differ in number');
    eval { $kv->push(3, zeros(float, 3)) };
    like($@, qr/shape mismatch for key 3/, 'shape mismatch');
    eval { $kv->pull(3) };
    like($@, qr/pull needs out/, 'pull without out');
    eval { $kv->push(3, zeros(byte, 2)) };
    like($@, qr/PDL type byte has no synkv dtype/, 'unsupported PDL type');
    $kv->set_updater(sub { die "boom\n" });
    $kv->push(3, ones(float, 2));
    eval { $kv->pull(3, out => zeros(float, 2)) };
    like($@, qr/Perl updater died: boom/, 'an updater that dies fails the next pull of its key');
    eval { $kv->wait_all };
    my $out = zeros(float, 2);
    $kv->pull(3, out => $out);
    ok(all($out == 0), 'the key kept its last good value');
};

subtest 'gradient compression' => sub {
    # K7.1: a local store refuses; a device store quantizes even one push (2bit, t = 0.5)
    eval { SynKV->create('local')->set_gradient_compression({type => '2bit'}) };
    like($@, qr/not supported for this type of kvstore/, 'local refuses');
    my $kv = SynKV->create('device');
    eval { $kv->set_gradient_compression({type => '2bit', threshold => 0}) };
    like($@, qr/greater than 0/, '2bit threshold must be > 0');
    $kv->set_gradient_compression({type => '2bit', threshold => 0.5});
    $kv->init(1, zeros(float, 8));
    $kv->push(1, pdl(float, [0.6, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49]));
    my $out = zeros(float, 8);
    $kv->pull(1, out => $out);
    ok(all($out == pdl(float, [0.5, -0.5, 0, 0.5, -0.5, 0, 0.5, 0])), 'K7.6 dequantized values');
};

done_testing();
