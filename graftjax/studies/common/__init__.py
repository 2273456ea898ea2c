"""What several studies share: flags (`cli`, `impl_flags`), the text corpus, result files
(`results`), timing, plots, the run journal, the energy meter, device traces, and the results
page (`results_page`, which reads each study's `study.toml` and its page section).
"""
