package SynKV;

# SynKV: synkv's KVStore for Perl, over the C ABI (crates/synkv-capi) with FFI::Platypus.
# Method names and calling style follow AI::MXNet::KVStore; values are PDL piddles. This
# module only translates arguments: every KVStore rule is the Rust core's. See README.md.

use strict;
use warnings;

use Carp qw(croak);
use JSON::PP ();
use Scalar::Util ();

use SynKV::FFI;
use SynKV::NDArray;
use SynKV::RowSparse;

our $VERSION = '0.1.0';

sub _call { SynKV::FFI::call(@_) }

=head1 NAME

SynKV - a parameter-server key-value store (MXNet's KVStore, rebuilt in Rust) for Perl

=head1 SYNOPSIS

    use PDL;
    use SynKV;

    my $kv = SynKV->create('local');
    $kv->init(3, ones(3, 2) * 2);              # a synkv [2, 3] array (PDL dims are reversed)
    $kv->push(3, [ones(3, 2), ones(3, 2)]);    # two devices: summed, then assigned
    my $out = zeros(3, 2);
    $kv->pull(3, out => $out);                 # $out is now 2 everywhere
    $kv->set_updater(sub { my ($key, $input, $stored) = @_; $stored += $input * 3 });

=head1 METHODS

=over

=item SynKV->create($type = 'local')

A new store: C<local>, C<device>, C<local_update_cpu>, C<local_allreduce_cpu>,
C<local_allreduce_device> (case-insensitive); or C<dist_sync>, C<dist_async>,
C<dist_device_sync>, which join the job the C<DMLC_*> environment describes (run the script
under C<synkv launch>, as F<t/dist.t> does).

=cut

# Every store alive (weak references), so that END can close them: a dist worker must tell the
# cluster it is done, and a failure then must not pass silently.
my %LIVE;
my $CLOSE_FAILED = 0;

sub create {
    my ($class, $name) = @_;
    my $h;
    _call('kv_create', $name // 'local', \$h);
    my $self = bless { handle => $h }, $class;
    $LIVE{"$self"} = $self;
    Scalar::Util::weaken($LIVE{"$self"});
    return $self;
}

=item $kv->close

Waits for the store's operations and, on a dist store, leaves the cluster: tells the scheduler
this worker is done and waits until every worker is (however long; a dead node ends the wait
with an error). Called at exit for the stores still alive; a failure there makes the script
exit with status 1.

=cut

sub close {
    my ($self) = @_;
    _call('kv_close', $self->{handle}) if $self->{handle};
    return;
}

=item ($id, $round) = $kv->checkpoint($dir)

Takes a consistent checkpoint of a dist job's servers into the directory C<$dir> (every worker
calls it at the same point of training). A job started with C<SYNKV_CHECKPOINT_DIR=$dir>
resumes from the newest one; C<< $kv->resumed_round >> then says from which round
(C<undef> for a fresh job).

=cut

sub checkpoint {
    my ($self, $dir) = @_;
    my ($id, $round) = (0, 0);
    _call('kv_checkpoint', $self->{handle}, $dir, \$id, \$round);
    return ($id, $round);
}

sub resumed_round {
    my ($self) = @_;
    my $round = 0;
    _call('kv_resumed_round', $self->{handle}, \$round);
    return $round < 0 ? undef : $round;
}

sub DESTROY {
    my ($self) = @_;
    delete $LIVE{"$self"};
    return unless $self->{handle};
    if (SynKV::FFI::synkv_kv_free($self->{handle}) != SynKV::FFI::OK) {
        my $msg = SynKV::FFI::synkv_get_last_error() // '';
        warn "SynKV: closing the store failed: $msg\n";
        $CLOSE_FAILED = 1;
    }
    delete $self->{handle};
}

END {
    for my $kv (grep { defined } values %LIVE) {
        next unless $kv->{handle};
        if (SynKV::FFI::synkv_kv_close($kv->{handle}) != SynKV::FFI::OK) {
            my $msg = SynKV::FFI::synkv_get_last_error() // '';
            warn "SynKV: error at exit: closing the store failed: $msg\n";
            $CLOSE_FAILED = 1;
        }
    }
    $? = 1 if $CLOSE_FAILED && $? == 0;
}

# Keys that look like 32-bit integers are int keys; other keys are str keys.
sub _key_kind {
    my ($keys) = @_;
    my $ints = grep { defined $_ && /^-?\d+\z/ && $_ >= -2**31 && $_ < 2**31 } @$keys;
    return 'int' if $ints == @$keys;
    return 'str' if $ints == 0;
    croak "SynKV: inconsistent types of keys detected (int and str keys in one call)";
}

# MXNet's flattening of ($key, $value): one key and one value or a list of per-device values;
# or a list of keys with one value or one list of values each. Returns (keys, counts, values).
sub _key_value {
    my ($key, $value, $what) = @_;
    if (ref $key ne 'ARRAY') {
        my @vals = ref $value eq 'ARRAY' ? @$value : ($value);
        return ([$key], [scalar @vals], \@vals);
    }
    my $n = ref $value eq 'ARRAY' ? @$value : 1;
    croak "SynKV: $what: " . @$key . " keys but $n values; give one value (or one list of values) per key"
        unless ref $value eq 'ARRAY' && $n == @$key;
    my (@counts, @flat);
    for my $v (@$value) {
        my @vs = ref $v eq 'ARRAY' ? @$v : ($v);
        CORE::push @counts, scalar @vs;
        CORE::push @flat, @vs;
    }
    return ([@$key], \@counts, \@flat);
}

sub _handles {
    my ($scope, $values, $is_output) = @_;
    return [map { SynKV::NDArray::handle_of($_, $scope, $is_output) } @$values];
}

=item init($key, $value)

Initialises keys (a key or a list of keys) with values (copied).

=cut

sub init {
    my ($self, $key, $value) = @_;
    my ($keys, $counts, $vals) = _key_value($key, $value, 'init');
    my @repeated = map { ($keys->[$_]) x $counts->[$_] } 0 .. $#$keys;    # one value per key in C
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind(\@repeated);
    _call("kv_init_$kind", $self->{handle}, scalar @repeated, \@repeated, _handles($scope, $vals, 0));
}

=item push($key, $value, priority => 0)

Pushes values; the values of one key (a list of per-device values) are summed, then the
updater runs on the sum, or the sum is assigned.

=cut

sub push {
    my ($self, $key, $value, %opt) = @_;
    my ($keys, $counts, $vals) = _key_value($key, $value, 'push');
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind($keys);
    _call("kv_push_$kind", $self->{handle}, scalar @$keys, $keys, $counts, _handles($scope, $vals, 0), $opt{priority} // 0);
}

=item pull($key, out => $out, priority => 0, ignore_sparse => 1)

Pulls values into outputs (piddles, written in place; or SynKV::RowSparse outputs, skipped
unless C<< ignore_sparse => 0 >>).

=cut

sub pull {
    my ($self, $key, %opt) = @_;
    croak "SynKV: pull needs out => ..." unless defined $opt{out};
    my ($keys, $counts, $outs) = _key_value($key, $opt{out}, 'pull');
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind($keys);
    my $skipped = 0;
    _call("kv_pull_with_sparse_$kind", $self->{handle}, scalar @$keys, $keys, $counts, _handles($scope, $outs, 1),
        $opt{priority} // 0, ($opt{ignore_sparse} // 1) ? 1 : 0, \$skipped);
    $scope->finish;
    return;
}

=item pushpull($key, $value, out => $out, priority => 0)

Push, then pull the updated value into C<out>, or back into C<$value> without C<out>.

=cut

sub pushpull {
    my ($self, $key, $value, %opt) = @_;
    my ($keys, $counts, $vals) = _key_value($key, $value, 'pushpull');
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind($keys);
    if (!defined $opt{out}) {
        _call("kv_pushpull_inplace_$kind", $self->{handle}, scalar @$keys, $keys, $counts, _handles($scope, $vals, 1),
            undef, undef, $opt{priority} // 0);
    } else {
        my (undef, $out_counts, $outs) = _key_value($key, $opt{out}, 'pushpull');
        my $vh = _handles($scope, $vals, 0);
        _call("kv_pushpull_$kind", $self->{handle}, scalar @$keys, $keys, $counts, $vh, $out_counts,
            _handles($scope, $outs, 1), $opt{priority} // 0);
    }
    $scope->finish;
    return;
}

=item broadcast($key, $value, out => $out, priority => 0)

C<init($key, $value)> then C<pull($key, out => $out)>.

=cut

sub broadcast {
    my ($self, $key, $value, %opt) = @_;
    croak "SynKV: broadcast needs out => ..." unless defined $opt{out};
    my ($keys, $vcounts, $vals) = _key_value($key, $value, 'broadcast');
    croak "SynKV: broadcast takes one value per key" if grep { $_ != 1 } @$vcounts;
    my (undef, $counts, $outs) = _key_value($key, $opt{out}, 'broadcast');
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind($keys);
    my $vh = _handles($scope, $vals, 0);
    _call("kv_broadcast_$kind", $self->{handle}, scalar @$keys, $keys, $vh, $counts, _handles($scope, $outs, 1), $opt{priority} // 0);
    $scope->finish;
    return;
}

=item row_sparse_pull($key, out => $out, row_ids => $row_ids, priority => 0)

Pulls only the rows C<$row_ids> (a piddle or array ref of any numeric type and shape) of
row_sparse keys into SynKV::RowSparse outputs. Give one row-id array for all outputs, or one
per output in the same nesting as C<out>.

=cut

sub row_sparse_pull {
    my ($self, $key, %opt) = @_;
    croak "SynKV: row_sparse_pull needs out => ... and row_ids => ..." unless defined $opt{out} && defined $opt{row_ids};
    my ($keys, $counts, $outs) = _key_value($key, $opt{out}, 'row_sparse_pull');
    my $ids = $opt{row_ids};
    my $flat_ids;
    if (ref $ids eq 'ARRAY' && (ref $key eq 'ARRAY' || ref $opt{out} eq 'ARRAY')) {
        my (undef, $id_counts, $flat) = _key_value($key, $ids, 'row_sparse_pull');
        croak "SynKV: row_sparse_pull: the number of row_ids doesn't match the number of outputs"
            unless "@$id_counts" eq "@$counts";
        $flat_ids = $flat;
    } else {
        $flat_ids = [($ids) x @$outs];    # one row-id array for every output
    }
    my $scope = SynKV::NDArray::Scope->new;
    my $kind = _key_kind($keys);
    my $oh = _handles($scope, $outs, 1);
    _call("kv_row_sparse_pull_$kind", $self->{handle}, scalar @$keys, $keys, $counts, $oh, _handles($scope, $flat_ids, 0),
        $opt{priority} // 0);
    $scope->finish;
    return;
}

=item set_updater(sub { my ($key, $input, $stored) = @_; ... })

Installs an updater, called once per key per push with the key (an int or a string), the
summed pushed value and the stored value (piddles); change C<$stored> in place
(C<< $stored += ... >>). It runs inside C<push>, on the calling thread. C<_set_updater> is an
alias (AI::MXNet's name).

=cut

sub set_updater {
    my ($self, $updater) = @_;
    my $wrap = sub {
        my ($key, $recv, $stored) = @_;
        my $ok = eval {
            my $input = SynKV::NDArray::to_pdl($recv);
            my $value = SynKV::NDArray::to_pdl($stored);
            $updater->($key, $input, $value);
            SynKV::NDArray::write_pdl($stored, $value);
            1;
        };
        return 0 if $ok;
        my $err = "$@";
        chomp $err;
        SynKV::FFI::synkv_set_last_error("Perl updater died: $err");
        return 1;
    };
    my $int_cb = SynKV::FFI->closure(sub { $wrap->(@_[0 .. 2]) });
    my $str_cb = SynKV::FFI->closure(sub { $wrap->(@_[0 .. 2]) });
    _call('kv_set_updater', $self->{handle}, $int_cb, $str_cb, undef, SynKV::FFI::UPDATER_CALLER_THREAD);
    $self->{updater} = [$int_cb, $str_cb];    # keep the closures alive while installed
    return;
}

*_set_updater = \&set_updater;

=item set_optimizer($name, %params) or set_optimizer(\%description)

Installs an optimizer, run by the store on every push (it replaces any updater):
C<< set_optimizer('sgd', learning_rate => 0.1, momentum => 0.9) >>, or synkv's JSON
description as a hash, C<< set_optimizer({name => 'sgd', momentum => 0.9, common =>
{learning_rate => 0.1}}) >>. MXNet's Perl takes an AI::MXNet::Optimizer object instead.

=cut

sub set_optimizer {
    my ($self, $opt, %params) = @_;
    if (ref $opt eq 'HASH') {
        _call('kv_set_optimizer_json', $self->{handle}, JSON::PP->new->canonical->encode($opt));
    } else {
        my @names = sort keys %params;
        my @values = map { ref $_ ? JSON::PP->new->canonical->encode($_) : $_ // 'null' } @params{@names};
        _call('kv_set_optimizer', $self->{handle}, $opt, scalar @names, \@names, \@values);
    }
    delete $self->{updater};
    return;
}

=item set_gradient_compression(\%params)

Turns on gradient compression with MXNet's parameters, e.g.
C<< set_gradient_compression({type => '2bit', threshold => 0.5}) >>. As in AI::MXNet, a store
whose type is not a C<device> or dist type refuses; a C<device> store quantizes every push, a
dist store sends every push to the servers as packed words.

=cut

sub set_gradient_compression {
    my ($self, $params) = @_;
    croak('set_gradient_compression takes a hash reference, e.g. {type => "2bit", threshold => 0.5}') unless ref $params eq 'HASH';
    my @names = sort keys %$params;
    my @values = map { "$_" } @{$params}{@names};
    _call('kv_set_gradient_compression', $self->{handle}, scalar @names, \@names, \@values);
    return;
}

=item save_optimizer_states($fname), load_optimizer_states($fname)

Saves the installed optimizer's states (with its description) to a file, or loads them.

=cut

sub save_optimizer_states { my ($self, $fname) = @_; _call('kv_save_optimizer_states', $self->{handle}, $fname); return }

sub load_optimizer_states { my ($self, $fname) = @_; _call('kv_load_optimizer_states', $self->{handle}, $fname); return }

=item type, rank, num_workers

The store type's name (lower-cased), this worker's rank and the number of workers (0 and 1
for in-process stores).

=cut

sub type {
    my ($self) = @_;
    my $p;
    _call('kv_type', $self->{handle}, \$p);
    return SynKV::FFI->cast('opaque', 'string', $p);
}

sub rank {
    my ($self) = @_;
    my $r;
    _call('kv_rank', $self->{handle}, \$r);
    return $r;
}

sub num_workers {
    my ($self) = @_;
    my $n;
    _call('kv_num_workers', $self->{handle}, \$n);
    return $n;
}

=item barrier (alias _barrier), wait_all

A barrier across workers (a no-op for in-process stores); wait for every pending operation,
croaking with the first error one raised since the previous C<wait_all>.

=back

=cut

sub barrier { my ($self) = @_; _call('kv_barrier', $self->{handle}); return }
*_barrier = \&barrier;

sub wait_all { my ($self) = @_; _call('kv_wait_all', $self->{handle}); return }

1;
