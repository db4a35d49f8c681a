package SynKV::NDArray;

# PDL piddles <-> synkv array handles.
#
# - view($pdl, $scope): a zero-copy synkv view over the piddle's data (its packed string,
#   from get_dataref). The C call that uses it waits for its work on the view before it
#   returns; outputs then call upd_data so PDL sees the new values. Piddles that are slices of
#   another piddle are copied in (and written back with .=), since their data string is not
#   the parent's memory.
# - to_pdl($handle): a new piddle holding a copy of a handle's elements (densified).
# - write_pdl($handle, $pdl): copies a piddle's elements into a handle.
#
# Shapes: synkv's shape is PDL's dims reversed (a synkv [2, 3] array is a PDL of dims (3, 2),
# which prints as 2 rows of 3), so the memory layout is the same and nothing is transposed.
# Dtypes: float <-> f32, double <-> f64, long <-> i32, longlong/indx <-> i64.

use strict;
use warnings;

use Carp qw(croak);
use PDL::Lite;
use PDL::Core qw(topdl);
use FFI::Platypus::Buffer qw(scalar_to_buffer);
use Scalar::Util qw(blessed refaddr);

use SynKV::FFI;

my %DTYPE_OF = (float => SynKV::FFI::DTYPE_F32, double => SynKV::FFI::DTYPE_F64, long => SynKV::FFI::DTYPE_I32,
    longlong => SynKV::FFI::DTYPE_I64, indx => SynKV::FFI::DTYPE_I64);
my %PDL_TYPE_OF = (SynKV::FFI::DTYPE_F32, 'float', SynKV::FFI::DTYPE_F64, 'double', SynKV::FFI::DTYPE_I32, 'long',
    SynKV::FFI::DTYPE_I64, 'longlong');

# The synkv dtype code of a piddle.
sub dtype_of {
    my ($pdl) = @_;
    my $name = $pdl->type . '';
    my $code = $DTYPE_OF{$name};
    croak "SynKV: PDL type $name has no synkv dtype; convert with ->float, ->double, ->long or ->longlong" unless defined $code;
    return $code;
}

# The synkv shape of a piddle (its dims, reversed).
sub shape_of { my ($pdl) = @_; return [reverse $pdl->dims] }

sub _is_slice {
    my ($pdl) = @_;
    return defined $pdl->trans_parent;
}

# A zero-copy view over $pdl, registered in $scope (freed with it). With $is_output, $scope
# also remembers to tell PDL about the new data after the call.
sub view {
    my ($pdl, $scope, $is_output) = @_;
    my $seen = $scope->{seen}{ refaddr $pdl } //= do {
        my $target = _is_slice($pdl) ? $pdl->copy : $pdl;    # a slice: physical, severed copy
        my $data = $target->get_dataref;
        my ($ptr) = scalar_to_buffer($$data);
        my $shape = shape_of($target);
        my $h;
        SynKV::FFI::call('array_view', $ptr, dtype_of($target), scalar @$shape, $shape, \$h);
        $scope->add($h);
        { handle => $h, target => $target, output => 0 };
    };
    if ($is_output && !$seen->{output}) {
        $seen->{output} = 1;
        push @{ $scope->{updated} }, $seen->{target};
        push @{ $scope->{writeback} }, [$pdl, $seen->{target}] if refaddr($seen->{target}) != refaddr($pdl);
    }
    return $seen->{handle};
}

# A handle for a value or output: a SynKV::RowSparse's own handle, or a view of a piddle
# (inputs may also be anything PDL's topdl accepts, such as a number or an array ref).
sub handle_of {
    my ($value, $scope, $is_output) = @_;
    return $value->handle if blessed $value && $value->isa('SynKV::RowSparse');
    if (!(blessed $value && $value->isa('PDL'))) {
        croak "SynKV: an output must be a PDL piddle or a SynKV::RowSparse, got " . (defined $value ? "$value" : 'undef')
            if $is_output;
        $value = topdl($value);
    }
    return view($value, $scope, $is_output);
}

# The PDL type of a synkv dtype code.
sub to_pdl_type {
    my ($code) = @_;
    my $name = $PDL_TYPE_OF{$code} // croak "SynKV: synkv dtype $code has no PDL type (PDL has no float16 / bfloat16)";
    return PDL::Type->new($name);
}

sub _handle_info {
    my ($h) = @_;
    my ($ndim, $dims_ptr, $dtype);
    SynKV::FFI::call('array_shape', $h, \$ndim, \$dims_ptr);
    SynKV::FFI::call('array_dtype', $h, \$dtype);
    my $dims = $ndim ? SynKV::FFI->cast('opaque', "uint64[$ndim]", $dims_ptr) : [];
    return ($dims, to_pdl_type($dtype));
}

# A new piddle with a copy of the handle's elements (row_sparse arrays are densified).
sub to_pdl {
    my ($h) = @_;
    my ($dims, $type) = _handle_info($h);
    my $pdl = PDL->new_from_specification($type, reverse @$dims);
    my $data = $pdl->get_dataref;
    my ($ptr, $size) = scalar_to_buffer($$data);
    SynKV::FFI::call('array_read', $h, $ptr, $size);
    $pdl->upd_data;
    return $pdl;
}

# Copies $pdl's elements into the handle (converted to its dtype; shapes must match).
sub write_pdl {
    my ($h, $pdl) = @_;
    my ($dims, $type) = _handle_info($h);
    my $src = $pdl->type . '' eq $type . '' ? $pdl : $pdl->convert($type);
    $src = $src->copy if _is_slice($src);
    my $data = $src->get_dataref;
    my ($ptr, $size) = scalar_to_buffer($$data);
    SynKV::FFI::call('array_write', $h, $ptr, $size);
}

# The handles of one call, freed when the scope goes out of scope (also on croak).
package SynKV::NDArray::Scope;

sub new { return bless { handles => [], updated => [], writeback => [], seen => {} }, shift }

sub add { my ($self, $h) = @_; push @{ $self->{handles} }, $h }

# After a successful call: PDL re-reads the data strings the call wrote.
sub finish {
    my ($self) = @_;
    $_->upd_data for @{ $self->{updated} };
    $_->[0] .= $_->[1] for @{ $self->{writeback} };
}

sub DESTROY {
    my ($self) = @_;
    SynKV::FFI::synkv_array_free($_) for @{ $self->{handles} };
}

1;
