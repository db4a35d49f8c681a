package SynKV::RowSparse;

# A row_sparse array (PDL has no sparse type): a logical shape plus the rows it holds, kept in
# a synkv array handle that this object owns. Use it as a value (init, push) or as an output
# (row_sparse_pull, or pull with ignore_sparse => 0); read it back with aspdl (dense copy),
# indices and data.
#
#   SynKV::RowSparse->zeros([4, 4])                 # no rows: the usual row_sparse_pull output
#   SynKV::RowSparse->from_pdl($dense)              # the non-zero rows (MXNet's tostype)
#   SynKV::RowSparse->new([4, 4], [1, 3], $rows)    # rows 1 and 3; $rows has dims (4, 2)
#
# Shapes are synkv's (outermost first), as elsewhere in SynKV; the PDLs returned by aspdl and
# data have the dims reversed.

use strict;
use warnings;

use Carp qw(croak);
use PDL::Lite;
use PDL::Core qw(topdl);
use FFI::Platypus::Buffer qw(scalar_to_buffer);

use SynKV::FFI;
use SynKV::NDArray;

sub _row_len { my ($shape) = @_; my $n = 1; $n *= $_ for @$shape[1 .. $#$shape]; return $n }

# A row_sparse array of $shape holding rows @$indices (sorted, unique) whose elements are
# $data (anything topdl accepts; its type sets the dtype, default float).
sub new {
    my ($class, $shape, $indices, $data) = @_;
    my @ids = ref $indices eq 'ARRAY' ? @$indices : topdl($indices)->list;
    my $rows = defined $data ? topdl($data) : PDL->new_from_specification(PDL::Type->new('float'), 0);
    my $dtype = SynKV::NDArray::dtype_of($rows);
    $rows = $rows->copy if defined $rows->trans_parent;
    my ($ptr, $size) = @ids ? scalar_to_buffer(${ $rows->get_dataref }) : (undef, 0);
    my $h;
    SynKV::FFI::call('array_row_sparse', $dtype, scalar @$shape, $shape, scalar @ids, \@ids, $ptr, $size, \$h);
    return bless { handle => $h, shape => [@$shape] }, $class;
}

# An all-zero row_sparse array (no rows held); `type => 'double'` etc. picks the dtype.
sub zeros {
    my ($class, $shape, %opt) = @_;
    my $type = PDL::Type->new($opt{type} // 'float');
    return $class->new($shape, [], PDL->new_from_specification($type, 0));
}

# The rows of a dense piddle that hold a non-zero element (MXNet's tostype('row_sparse')).
sub from_pdl {
    my ($class, $pdl) = @_;
    $pdl = topdl($pdl);
    my $shape = SynKV::NDArray::shape_of($pdl);
    croak "SynKV::RowSparse: a 0-d piddle has no rows" unless @$shape;
    my $flat = $pdl->reshape(_row_len($shape), $shape->[0]);
    my $ids = PDL::Primitive::which(($flat != 0)->orover);
    my $rows = $ids->nelem ? $flat->dice_axis(1, $ids)->copy : PDL->new_from_specification($pdl->type, 0);
    return $class->new($shape, [$ids->list], $rows);
}

sub handle { return $_[0]{handle} }

# The logical shape (synkv order).
sub shape { return [ @{ $_[0]{shape} } ] }

# A dense copy as a piddle (rows not held are zeros).
sub aspdl { return SynKV::NDArray::to_pdl($_[0]{handle}) }

# The ids of the rows held, as a longlong piddle.
sub indices {
    my ($self) = @_;
    my ($ids) = $self->_rows;
    return $ids;
}

# The rows held, as a piddle of dims (row dims reversed..., number of rows).
sub data {
    my ($self) = @_;
    my (undef, $data) = $self->_rows;
    return $data;
}

sub _rows {
    my ($self) = @_;
    my $h = $self->{handle};
    my ($n, $dtype);
    SynKV::FFI::call('array_row_sparse_nrows', $h, \$n);
    SynKV::FFI::call('array_dtype', $h, \$dtype);
    my $dense_type = SynKV::NDArray::to_pdl_type($dtype);
    my @row_dims = reverse @{ $self->{shape} }[1 .. $#{ $self->{shape} }];
    my $ids = PDL->new_from_specification(PDL::Type->new('longlong'), $n);
    my $data = PDL->new_from_specification($dense_type, @row_dims, $n);
    if ($n) {
        my ($iptr, $isize) = scalar_to_buffer(${ $ids->get_dataref });
        my ($dptr, $dsize) = scalar_to_buffer(${ $data->get_dataref });
        SynKV::FFI::call('array_row_sparse_read', $h, $iptr, $n, $dptr, $dsize);
        $ids->upd_data;
        $data->upd_data;
    }
    return ($ids, $data);
}

sub DESTROY {
    my ($self) = @_;
    SynKV::FFI::synkv_array_free($self->{handle}) if $self->{handle};
}

1;
