package SynKV::FFI;

# The raw binding: loads libsynkv_capi and attaches the C functions of include/synkv.h as
# SynKV::FFI::synkv_* subs. Holds no logic; SynKV.pm and its helpers call these through
# call(), which turns a non-zero status into a croak with synkv's last-error message.

use strict;
use warnings;

use Carp qw(croak);
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use FFI::Platypus 2.00;

our $VERSION = '0.1.0';

# Status and constant values, as in include/synkv.h.
use constant {
    OK                   => 0,
    DTYPE_F32            => 0,
    DTYPE_F64            => 1,
    DTYPE_F16            => 2,
    DTYPE_I32            => 4,
    DTYPE_I64            => 6,
    DTYPE_BF16           => 12,
    STYPE_DENSE          => 0,
    STYPE_ROW_SPARSE     => 1,
    UPDATER_CALLER_THREAD => 1,
};

# The shared library: $ENV{SYNKV_LIB}, else the newest libsynkv_capi.so under the
# repository's (or $ENV{CARGO_TARGET_DIR}'s) release/ and debug/ folders.
sub library_path {
    return $ENV{SYNKV_LIB} if $ENV{SYNKV_LIB};
    my $root = abs_path(dirname(__FILE__) . '/../../../..');
    my @dirs = ("$root/target");
    unshift @dirs, $ENV{CARGO_TARGET_DIR} if $ENV{CARGO_TARGET_DIR};
    my @found = grep { -f $_ } map { ("$_/release/libsynkv_capi.so", "$_/debug/libsynkv_capi.so") } @dirs;
    croak "SynKV: libsynkv_capi.so not found; build it with `cargo build -p synkv-capi` "
        . "or set SYNKV_LIB to its path" unless @found;
    my ($newest) = sort { (stat $b)[9] <=> (stat $a)[9] } @found;
    return $newest;
}

our $ffi = FFI::Platypus->new(api => 2, lib => [library_path()]);

$ffi->type('(sint32, opaque, opaque, opaque)->sint32' => 'synkv_updater');
$ffi->type('(string, opaque, opaque, opaque)->sint32' => 'synkv_str_updater');

my %functions = (
    synkv_get_last_error          => [[] => 'string'],
    synkv_set_last_error          => [['string'] => 'sint32'],
    synkv_version                 => [[] => 'string'],
    synkv_array_create            => [['sint32', 'uint32', 'uint64[]', 'opaque*'] => 'sint32'],
    synkv_array_view              => [['opaque', 'sint32', 'uint32', 'uint64[]', 'opaque*'] => 'sint32'],
    synkv_array_row_sparse        => [['sint32', 'uint32', 'uint64[]', 'uint64', 'sint64[]', 'opaque', 'uint64', 'opaque*'] => 'sint32'],
    synkv_array_free              => [['opaque'] => 'sint32'],
    synkv_array_shape             => [['opaque', 'uint32*', 'opaque*'] => 'sint32'],
    synkv_array_dtype             => [['opaque', 'sint32*'] => 'sint32'],
    synkv_array_stype             => [['opaque', 'sint32*'] => 'sint32'],
    synkv_array_read              => [['opaque', 'opaque', 'uint64'] => 'sint32'],
    synkv_array_write             => [['opaque', 'opaque', 'uint64'] => 'sint32'],
    synkv_array_row_sparse_nrows  => [['opaque', 'uint64*'] => 'sint32'],
    synkv_array_row_sparse_read   => [['opaque', 'opaque', 'uint64', 'opaque', 'uint64'] => 'sint32'],
    synkv_kv_create               => [['string', 'opaque*'] => 'sint32'],
    synkv_kv_free                 => [['opaque'] => 'sint32'],
    synkv_kv_close                => [['opaque'] => 'sint32'],
    synkv_kv_checkpoint           => [['opaque', 'string', 'uint64*', 'uint64*'] => 'sint32'],
    synkv_kv_resumed_round        => [['opaque', 'sint64*'] => 'sint32'],
    synkv_kv_type                 => [['opaque', 'opaque*'] => 'sint32'],
    synkv_kv_rank                 => [['opaque', 'sint32*'] => 'sint32'],
    synkv_kv_num_workers          => [['opaque', 'sint32*'] => 'sint32'],
    synkv_kv_barrier              => [['opaque'] => 'sint32'],
    synkv_kv_wait_all             => [['opaque'] => 'sint32'],
    synkv_kv_set_updater          => [['opaque', 'synkv_updater', 'synkv_str_updater', 'opaque', 'sint32'] => 'sint32'],
    synkv_kv_clear_updater        => [['opaque'] => 'sint32'],
    synkv_kv_set_optimizer        => [['opaque', 'string', 'uint32', 'string[]', 'string[]'] => 'sint32'],
    synkv_kv_set_gradient_compression => [['opaque', 'uint32', 'string[]', 'string[]'] => 'sint32'],
    synkv_kv_set_optimizer_json   => [['opaque', 'string'] => 'sint32'],
    synkv_kv_save_optimizer_states => [['opaque', 'string'] => 'sint32'],
    synkv_kv_load_optimizer_states => [['opaque', 'string'] => 'sint32'],
);
for my $kind (['int', 'sint32[]'], ['str', 'string[]']) {
    my ($suffix, $keys) = @$kind;
    my @head = ('opaque', 'uint32', $keys);
    $functions{"synkv_kv_init_$suffix"}             = [[@head, 'opaque[]'] => 'sint32'];
    $functions{"synkv_kv_push_$suffix"}             = [[@head, 'uint32[]', 'opaque[]', 'sint32'] => 'sint32'];
    $functions{"synkv_kv_pull_with_sparse_$suffix"} = [[@head, 'uint32[]', 'opaque[]', 'sint32', 'sint32', 'uint32*'] => 'sint32'];
    $functions{"synkv_kv_pushpull_$suffix"}         = [[@head, 'uint32[]', 'opaque[]', 'uint32[]', 'opaque[]', 'sint32'] => 'sint32'];
    $functions{"synkv_kv_broadcast_$suffix"}        = [[@head, 'opaque[]', 'uint32[]', 'opaque[]', 'sint32'] => 'sint32'];
    $functions{"synkv_kv_row_sparse_pull_$suffix"}  = [[@head, 'uint32[]', 'opaque[]', 'opaque[]', 'sint32'] => 'sint32'];
}
$ffi->attach($_ => @{ $functions{$_} }) for sort keys %functions;
# pushpull with outs = NULL (in place): the same C functions with pointer-typed out arguments.
for my $kind (['int', 'sint32[]'], ['str', 'string[]']) {
    my ($suffix, $keys) = @$kind;
    $ffi->attach(["synkv_kv_pushpull_$suffix" => "synkv_kv_pushpull_inplace_$suffix"]
        => ['opaque', 'uint32', $keys, 'uint32[]', 'opaque[]', 'opaque', 'opaque', 'sint32'] => 'sint32');
}

# Calls synkv_<name>(@args); croaks with synkv's message when the status is not OK.
sub call {
    my ($name, @args) = @_;
    my $fn = \&{"SynKV::FFI::synkv_$name"};
    my $rc = $fn->(@args);
    return if $rc == OK;
    my $msg = synkv_get_last_error() // '';
    local $Carp::CarpLevel = 1;
    croak "SynKV: $name failed ($rc): $msg";
}

sub closure { my (undef, $sub) = @_; return $ffi->closure($sub) }

# Casts a C pointer to another type (e.g. a const char* to a Perl string).
sub cast { my (undef, @args) = @_; return $ffi->cast(@args) }

1;
