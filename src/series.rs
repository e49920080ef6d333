//! A per-phase series of scalars a job keeps at the coordinator: see [`Series`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A record of scalars per phase (an energy, a residual, a probe's value), kept in the job
/// value by [`Job::end_phase`](crate::Job::end_phase) (or [`Rows::end_phase`](crate::Rows::end_phase))
/// at the coordinator, and never sent to worker processes.
///
/// The job value is where the coordinator's state between phases lives: snapshots store it,
/// a rollback or a resume goes back to it, and [`Finished::job`](crate::Finished::job) hands
/// it back. But it is also sent to every worker process at every phase, so a history kept in
/// it as a `Vec` costs its whole length per process per phase, for values no worker reads.
/// A `Series` field is written whole wherever the job value is stored (a snapshot: once per
/// snapshot; the run's outcome) and *empty* (its column count only) where it is sent to
/// worker processes. So:
///
/// - Push to it in `end_phase`; read it there, or from the finished job. Workers (`update`,
///   a chunk's steps, [`Input::load`](crate::Input::load)) see it empty in a worker process
///   and whole in a local thread: never read it there.
/// - It survives suspend, resume and rollbacks with the job value: after a rollback it holds
///   the records of the phases before the snapshot, and the phases run again push theirs
///   once more, so it has one record per phase that ended, whatever happened in between.
///
/// # Example
///
/// ```
/// use malleable::Series;
///
/// let mut energy = Series::new(2); // kinetic, potential
/// energy.push(&[1.0, 0.5]);
/// energy.push(&[0.75, 0.75]);
/// assert_eq!(energy.len(), 2);
/// assert_eq!(energy.get(1), Some(&[0.75, 0.75][..]));
/// assert_eq!(energy.column(0).collect::<Vec<_>>(), [1.0, 0.75]);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    columns: usize,
    /// The records one after the other, `columns` values each.
    values: Vec<f64>,
}

impl Series {
    /// An empty series of records of `columns` values each.
    pub fn new(columns: usize) -> Series {
        Series {
            columns,
            values: Vec::new(),
        }
    }

    /// Values per record.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// Records (phases) so far.
    pub fn len(&self) -> usize {
        self.values.len().checked_div(self.columns).unwrap_or(0)
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Appends a record.
    ///
    /// # Panics
    ///
    /// If `record` does not hold [`columns`](Series::columns) values.
    pub fn push(&mut self, record: &[f64]) {
        assert_eq!(
            record.len(),
            self.columns,
            "a record of {} values pushed to a series of {} columns",
            record.len(),
            self.columns
        );
        self.values.extend_from_slice(record);
    }

    /// Record `i` (0-based), if there is one.
    pub fn get(&self, i: usize) -> Option<&[f64]> {
        self.iter().nth(i)
    }

    /// The last record, if any.
    pub fn last(&self) -> Option<&[f64]> {
        self.iter().next_back()
    }

    /// The records in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &[f64]> + ExactSizeIterator + '_ {
        self.values.chunks_exact(self.columns.max(1))
    }

    /// Column `j` of every record, in order (nothing if `j` is not a column).
    pub fn column(&self, j: usize) -> impl Iterator<Item = f64> + '_ {
        let records = if j < self.columns { self.len() } else { 0 };
        self.iter().take(records).map(move |r| r[j])
    }
}

/// How a [`Series`] is serialized: its column count, then its values (none when the job
/// value is sent to worker processes).
#[derive(Serialize, Deserialize)]
#[serde(rename = "Series")]
struct SeriesForm<V> {
    columns: u64,
    values: V,
}

impl Serialize for Series {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none: &[f64] = &[];
        SeriesForm {
            columns: self.columns as u64,
            values: if crate::codec::for_workers() {
                none
            } else {
                &self.values[..]
            },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Series {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let form = SeriesForm::<Vec<f64>>::deserialize(d)?;
        let columns = usize::try_from(form.columns).map_err(D::Error::custom)?;
        let whole = match columns {
            0 => form.values.is_empty(),
            c => form.values.len() % c == 0,
        };
        if !whole {
            return Err(D::Error::custom(format!(
                "a series of {columns} columns with {} values",
                form.values.len()
            )));
        }
        Ok(Series {
            columns,
            values: form.values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Series {
        let mut s = Series::new(2);
        for i in 0..5 {
            s.push(&[f64::from(i), -f64::from(i) * 0.5]);
        }
        s
    }

    #[test]
    fn records_come_back_in_order() {
        let s = series();
        assert_eq!(s.len(), 5);
        assert_eq!(s.columns(), 2);
        assert_eq!(s.get(3), Some(&[3.0, -1.5][..]));
        assert_eq!(s.get(5), None);
        assert_eq!(s.last(), Some(&[4.0, -2.0][..]));
        assert_eq!(
            s.column(1).collect::<Vec<_>>(),
            [0.0, -0.5, -1.0, -1.5, -2.0]
        );
        assert_eq!(s.column(2).count(), 0);
        assert!(Series::new(0).is_empty());
        assert_eq!(Series::new(0).len(), 0);
    }

    /// Stored whole; sent to worker processes with its column count only.
    #[test]
    fn a_series_is_stored_whole_and_sent_to_workers_empty() {
        let s = series();
        let stored = crate::codec::encode("the job", &s).unwrap();
        let back: Series = crate::codec::decode("the job", &stored).unwrap();
        assert_eq!(back, s);
        let sent = crate::codec::encode_for_workers("the job", &s).unwrap();
        let there: Series = crate::codec::decode("the job", &sent).unwrap();
        assert_eq!(there, Series::new(2));
        assert!(sent.len() < 4, "{} bytes", sent.len());
        // The mode ends with the encoding.
        assert_eq!(crate::codec::encode("the job", &s).unwrap(), stored);
    }

    #[test]
    fn a_series_whose_values_do_not_fill_its_records_does_not_decode() {
        let bytes = crate::codec::encode(
            "the job",
            &SeriesForm {
                columns: 2,
                values: vec![1.0, 2.0, 3.0],
            },
        )
        .unwrap();
        assert!(crate::codec::decode::<Series>("the job", &bytes).is_err());
        let bytes = crate::codec::encode(
            "the job",
            &SeriesForm {
                columns: 0,
                values: vec![1.0],
            },
        )
        .unwrap();
        assert!(crate::codec::decode::<Series>("the job", &bytes).is_err());
    }

    #[test]
    #[should_panic(expected = "a record of 1 values pushed to a series of 2 columns")]
    fn a_record_of_another_width_is_refused() {
        Series::new(2).push(&[1.0]);
    }
}
