"""Reading and writing files, local or gs://: paths, atomic writes, text lines, the GCS emulator."""
