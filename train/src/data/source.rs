//! Documents from local files, in the formats Hugging Face datasets stores and loads with
//! its `text`, `json` and `parquet` builders:
//!
//! * `.txt`: one document per paragraph, paragraphs separated by blank lines (HF's `text`
//!   builder with `sample_by="paragraph"`): a book's paragraphs become documents that packing
//!   puts several to a row, and a file of one paragraph is one document;
//! * `.jsonl`, `.json`: one JSON object per line (or a `.json` file holding one array of
//!   objects), the text under the column named (`text` by default);
//! * `.parquet`: the column named, a string column (uncompressed or snappy, as pyarrow and
//!   HF datasets write it).
//!
//! A path is one file or a directory: its files (and its subdirectories'), in name order,
//! those of other extensions (a README.md beside the data) left out.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

use super::DataError;

/// One document's text and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub text: String,
    pub file: PathBuf,
}

/// The file formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Json,
    Parquet,
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()? {
        "txt" => Some(Format::Text),
        "jsonl" | "json" => Some(Format::Json),
        "parquet" => Some(Format::Parquet),
        _ => None,
    }
}

/// The documents of `path` (a file, or a directory of files), the text of JSON and Parquet
/// records read from `column`. Refused: a path that cannot be read, a directory without a
/// data file, a file of another extension, a file without text, a file that is not UTF-8, a
/// JSON line that is not an object or lacks the column.
pub fn read_documents(path: &Path, column: &str) -> Result<Vec<Document>, DataError> {
    let unreadable = |e: std::io::Error| DataError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let files = if meta.is_dir() {
        let mut files = Vec::new();
        walk(path, &mut files)?;
        files.retain(|f| format_of(f).is_some());
        if files.is_empty() {
            return Err(DataError::NoDataFiles {
                dir: path.to_path_buf(),
            });
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut docs = Vec::new();
    for file in files {
        let texts = match format_of(&file) {
            None => return Err(DataError::Format { path: file }),
            Some(Format::Text) => paragraphs(&read_utf8(&file)?),
            Some(Format::Json) => json_texts(&file, &read_utf8(&file)?, column)?,
            Some(Format::Parquet) => parquet_texts(&file, column)?,
        };
        let before = docs.len();
        docs.extend(
            texts
                .into_iter()
                .filter(|t| !t.trim().is_empty())
                .map(|text| Document {
                    text,
                    file: file.clone(),
                }),
        );
        if docs.len() == before {
            return Err(DataError::Empty { path: file });
        }
    }
    Ok(docs)
}

/// Every file under `dir`, in name order (subdirectories' in place), hidden ones left out.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let unreadable = |e: std::io::Error| DataError::Unreadable {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(unreadable)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    entries.sort();
    for p in entries {
        let hidden = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

fn read_utf8(path: &Path) -> Result<String, DataError> {
    let bytes = std::fs::read(path).map_err(|e| DataError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
        DataError::Utf8 {
            path: path.to_path_buf(),
            line,
        }
    })
}

/// The blank-line-separated paragraphs of `text`, each with its lines joined by `\n`.
pub fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                out.push(current.join("\n"));
                current.clear();
            }
        } else {
            current.push(line.trim_end());
        }
    }
    if !current.is_empty() {
        out.push(current.join("\n"));
    }
    out
}

/// The `column` of each record of a JSON-lines file (or of a file holding one JSON array).
fn json_texts(path: &Path, text: &str, column: &str) -> Result<Vec<String>, DataError> {
    let record = |value: serde_json::Value, place: String| -> Result<String, DataError> {
        let serde_json::Value::Object(map) = value else {
            return Err(DataError::Json {
                path: path.to_path_buf(),
                place,
                reason: "not an object".into(),
            });
        };
        match map.get(column) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            _ => Err(DataError::MissingColumn {
                path: path.to_path_buf(),
                place,
                column: column.to_string(),
            }),
        }
    };
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| DataError::Json {
                path: path.to_path_buf(),
                place: "(its array)".into(),
                reason: e.to_string(),
            })?;
        return values
            .into_iter()
            .enumerate()
            .map(|(i, v)| record(v, format!("record {}", i + 1)))
            .collect();
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let place = format!("line {}", i + 1);
        let value = serde_json::from_str(line).map_err(|e| DataError::Json {
            path: path.to_path_buf(),
            place: place.clone(),
            reason: e.to_string(),
        })?;
        out.push(record(value, place)?);
    }
    Ok(out)
}

/// The string column `column` of a Parquet file, row by row (nulls left out).
fn parquet_texts(path: &Path, column: &str) -> Result<Vec<String>, DataError> {
    let bad = |reason: String| DataError::Parquet {
        path: path.to_path_buf(),
        reason,
    };
    let file = File::open(path).map_err(|e| DataError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(e.to_string()))?;
    let has_column = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .any(|f| f.name() == column);
    let missing = |place: String| DataError::MissingColumn {
        path: path.to_path_buf(),
        place,
        column: column.to_string(),
    };
    if !has_column {
        return Err(missing("(its schema)".into()));
    }
    let mut out = Vec::new();
    let rows = reader.get_row_iter(None).map_err(|e| bad(e.to_string()))?;
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| bad(e.to_string()))?;
        let field = row
            .get_column_iter()
            .find(|(name, _)| name.as_str() == column)
            .map(|(_, f)| f);
        match field {
            Some(Field::Str(s)) => out.push(s.clone()),
            Some(Field::Null) => {}
            _ => return Err(missing(format!("row {}", i + 1))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    /// A snappy Parquet file as pyarrow writes HF datasets' rows: `id` (int32), `text`.
    fn write_parquet(path: &Path, texts: &[&str]) {
        let schema = parse_message_type(
            "message schema { REQUIRED INT32 id; REQUIRED BYTE_ARRAY text (UTF8); }",
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let file = File::create(path).unwrap();
        let mut writer =
            SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
        let mut group = writer.next_row_group().unwrap();
        let mut column = group.next_column().unwrap().unwrap();
        let ids: Vec<i32> = (0..texts.len() as i32).collect();
        column
            .typed::<Int32Type>()
            .write_batch(&ids, None, None)
            .unwrap();
        column.close().unwrap();
        let mut column = group.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = texts.iter().map(|t| ByteArray::from(*t)).collect();
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .unwrap();
        column.close().unwrap();
        group.close().unwrap();
        writer.close().unwrap();
    }

    /// A directory of every format, read in name order, its README left out; a Parquet
    /// column named otherwise is refused naming the file.
    #[test]
    fn a_directory_of_every_format() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("README.md"), "# card").unwrap();
        std::fs::write(d.join("a.txt"), "first\nparagraph\n\nsecond").unwrap();
        std::fs::write(
            d.join("b.jsonl"),
            "{\"text\": \"json one\"}\n\n{\"text\": \"json two\"}\n",
        )
        .unwrap();
        std::fs::write(d.join("c.json"), "[{\"body\": \"x\", \"text\": \"array\"}]").unwrap();
        std::fs::create_dir(d.join("d")).unwrap();
        write_parquet(
            &d.join("d/train-00000.parquet"),
            &["parquet one", "parquet two"],
        );
        let docs = read_documents(d, "text").unwrap();
        let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "first\nparagraph",
                "second",
                "json one",
                "json two",
                "array",
                "parquet one",
                "parquet two"
            ]
        );
        assert!(docs[5].file.ends_with("d/train-00000.parquet"));
        let e = read_documents(&d.join("d"), "content").unwrap_err();
        assert!(
            e.to_string()
                .contains("train-00000.parquet (its schema) has no text column `content`"),
            "{e}"
        );
        let body = read_documents(&d.join("c.json"), "body").unwrap();
        assert_eq!(body[0].text, "x");
    }

    #[test]
    fn paragraphs_split_on_blank_lines() {
        let p = paragraphs("a b\nc\n\n \nd\r\ne\n\n\nf");
        assert_eq!(p, ["a b\nc", "d\ne", "f"]);
    }
}
