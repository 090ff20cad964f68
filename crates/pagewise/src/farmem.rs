//! Disaggregated-memory emulation (DiME): a local page budget, a link model and
//! replacement policies over userfaultfd. Not yet implemented.
