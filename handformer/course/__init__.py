"""The course: `handformer learn` writes a folder of starter files, one a chapter of the tutorial
series, with a notebook each that grades the learner's file with `handformer check` and, once it
passes, plots what the chapter is about. `chapters.py` lists the chapters, `folder.py` writes and
resets the folder and reads its status, `lesson.py` is what the notebooks call, `starters/` holds
the starter files (English and Chinese lines of one template) and `notebooks/` the notebooks."""
