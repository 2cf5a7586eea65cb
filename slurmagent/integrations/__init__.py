"""Other trainers under slurmagent: each module gives one library's training loop the job's
stop protocol, exact resume, metrics and search rungs (docs/trainers.md). Each needs its
library, installed with the project's extra of the same name (`pip install 'slurmagent[lightning]'`)."""
