//! The documents of a Parquet file: the strings of its `text` column, one document a row, as
//! Hugging Face datasets publish corpora. Read with the `parquet` crate (Snappy-compressed or
//! uncompressed pages, the Hub's and pyarrow's default); only that column is decoded.

use anyhow::{Context, Result, anyhow, bail};
use parquet::basic::{ConvertedType, LogicalType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// The column a corpus keeps its documents in (as the JSON lines' field).
const COLUMN: &str = "text";

/// Every row's `text` of the Parquet file at `path`, in file order.
pub fn documents(path: &Path) -> Result<Vec<String>> {
    let shown = path.display();
    let file = File::open(path).with_context(|| format!("cannot read the data {shown}"))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| anyhow!("{shown} is not a readable Parquet file: {e}"))?;
    let root = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema();
    let fields = root.get_fields();
    let field = fields.iter().find(|f| f.name() == COLUMN).with_context(|| {
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        format!(
            "{shown} has no column '{COLUMN}' (its columns: {}); distflash reads one document per row from '{COLUMN}'",
            names.join(", ")
        )
    })?;
    if !is_string(field) {
        bail!("{shown}'s column '{COLUMN}' does not hold strings; it must be UTF-8 text");
    }
    let projection = Type::group_type_builder(root.name())
        .with_fields(vec![Arc::clone(field)])
        .build()
        .map_err(|e| anyhow!("cannot select the column '{COLUMN}' of {shown}: {e}"))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| anyhow!("cannot read {shown}: {e}"))?;
    let mut docs = Vec::new();
    for (n, row) in rows.enumerate() {
        let row = row.map_err(|e| decode_error(path, n, e))?;
        match row.get_column_iter().next().map(|(_, v)| v) {
            Some(Field::Str(s)) => docs.push(s.clone()),
            _ => bail!("{shown} row {}: '{COLUMN}' is empty (null)", n + 1),
        }
    }
    if docs.is_empty() {
        bail!("{shown} has no rows: there is nothing to train on");
    }
    Ok(docs)
}

/// Whether a column is a plain UTF-8 string column.
fn is_string(field: &Type) -> bool {
    field.is_primitive()
        && (matches!(
            field.get_basic_info().logical_type_ref(),
            Some(LogicalType::String)
        ) || field.get_basic_info().converted_type() == ConvertedType::UTF8)
}

/// A row that could not be decoded: most often a compression codec this build leaves out.
fn decode_error(path: &Path, row: usize, e: parquet::errors::ParquetError) -> anyhow::Error {
    anyhow!(
        "{} row {}: {e} (distflash reads Snappy-compressed and uncompressed Parquet; rewrite other codecs, e.g. with pyarrow's write_table(..., compression='snappy'))",
        path.display(),
        row + 1
    )
}
