"""The repository's tools, outside the package users install: test data and the fuzzers
(`testing`, `import_fuzz`), the calibration points and their modelling (`calibration`,
`calibration_points.json`), the GPU fits and their programs (`gpu_fit`, `gpu_programs`)
and the cost-model doc generator (`costdoc`). Tests and benches import them (run from the
repository root, or with it on sys.path); nothing under popviz/ or app/ does, and the
runtime reads only the fitted values in popviz/target/calibration.json."""
